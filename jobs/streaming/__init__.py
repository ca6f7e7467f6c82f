"""The Spark side: session, the streaming query, and the per-batch commit."""
