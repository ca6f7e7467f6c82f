package platform.streaming;

import java.io.IOException;
import java.util.EnumSet;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.CommonPathCapabilities;
import org.apache.hadoop.fs.CreateFlag;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.Options;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager;

/**
 * Spark's checkpoint files written in place where the store can abandon a write (S3A: an
 * object appears whole at close, or never): one PUT instead of a temporary file, a copy and
 * a delete. Elsewhere (a local disk) Spark's rename-based writes. What Spark's own
 * spark-hadoop-cloud module does (AbortableStreamBasedCheckpointFileManager), which Maven
 * Central does not serve for Spark 4.2.
 */
public final class AbortableCheckpointFileManager extends FileContextBasedCheckpointFileManager {
  private final boolean abortable;

  public AbortableCheckpointFileManager(Path path, Configuration hadoopConf) {
    super(path, hadoopConf);
    boolean found;
    try {
      found = fc().hasPathCapability(path, CommonPathCapabilities.ABORTABLE_STREAM);
    } catch (IOException e) {
      found = false;
    }
    this.abortable = found;
  }

  @Override
  public CheckpointFileManager.CancellableFSDataOutputStream createAtomic(
      Path path, boolean overwriteIfPossible) {
    if (!abortable) {
      return super.createAtomic(path, overwriteIfPossible);
    }
    EnumSet<CreateFlag> flags =
        overwriteIfPossible
            ? EnumSet.of(CreateFlag.CREATE, CreateFlag.OVERWRITE)
            : EnumSet.of(CreateFlag.CREATE);
    try {
      return new InPlace(fc().create(path, flags, Options.CreateOpts.createParent()));
    } catch (IOException e) {
      throw AbortableCheckpointFileManager.<RuntimeException>rethrown(e);
    }
  }

  /** ``e`` as it is: Spark's callers tell a file that exists (FileAlreadyExistsException). */
  @SuppressWarnings("unchecked")
  private static <E extends Throwable> E rethrown(Throwable e) throws E {
    throw (E) e;
  }

  /** Whole at close; abandoned (nothing visible) at cancel. */
  private static final class InPlace extends CheckpointFileManager.CancellableFSDataOutputStream {
    private final FSDataOutputStream out;
    private boolean done;

    InPlace(FSDataOutputStream out) {
      super(out);
      this.out = out;
    }

    @Override
    public synchronized void cancel() {
      if (done) {
        return;
      }
      done = true;
      try {
        out.abort();
        out.close();
      } catch (IOException | UnsupportedOperationException e) {
        // Nothing was made visible: an abandoned write leaves no object.
      }
    }

    @Override
    public synchronized void close() throws IOException {
      if (done) {
        return;
      }
      done = true;
      out.close();
    }
  }
}
