package platform.streaming;

/**
 * A failure the user repairs, raised by the platform's JVM sources. Its message is the
 * whole story: the Python side (jobs/errors.py) reports it as one error line, exit 2.
 */
public final class PlatformError extends IllegalStateException {
  private static final long serialVersionUID = 1L;

  public PlatformError(String message) {
    super(message);
  }
}
