package platform.streaming;

import java.io.IOException;
import java.util.EnumSet;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.CommonPathCapabilities;
import org.apache.hadoop.fs.CreateFlag;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSDataOutputStreamBuilder;
import org.apache.hadoop.fs.FileSystem;
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
 *
 * <p>A file Spark creates only if absent (offsets/N, commits/N, the metadata) is created
 * put-if-absent by the store itself (S3A's conditional create, {@code If-None-Match: *}):
 * FileContext's create probes for the file and then PUTs without a condition, so two drivers
 * that plan the same batch (a paused holder woken after a takeover) would each write it and
 * the last would win. Here the second is refused at close, and Spark stops that query.
 */
public final class AbortableCheckpointFileManager extends FileContextBasedCheckpointFileManager {
  // S3A's create option: the PUT carries If-None-Match: * (hadoop-aws 3.4.2+).
  static final String CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite";
  private final boolean abortable;
  private final Configuration hadoopConf;

  public AbortableCheckpointFileManager(Path path, Configuration hadoopConf) {
    super(path, hadoopConf);
    this.hadoopConf = hadoopConf;
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
    try {
      if (overwriteIfPossible) {
        EnumSet<CreateFlag> flags = EnumSet.of(CreateFlag.CREATE, CreateFlag.OVERWRITE);
        return new InPlace(fc().create(path, flags, Options.CreateOpts.createParent()));
      }
      FileSystem fs = path.getFileSystem(hadoopConf);
      FSDataOutputStreamBuilder<?, ?> builder = fs.createFile(path).overwrite(false).recursive();
      builder.must(CONDITIONAL_CREATE, true);
      return new InPlace(builder.build());
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
