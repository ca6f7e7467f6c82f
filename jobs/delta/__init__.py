"""Delta Lake tables of an application, written and read with delta-rs."""
