package platform.streaming;

import io.delta.storage.S3SingleDriverLogStore;
import java.io.IOException;
import java.io.InterruptedIOException;
import java.nio.charset.StandardCharsets;
import java.util.Iterator;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSDataOutputStreamBuilder;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * Delta-spark's log store for S3A, with each new log entry created put-if-absent by the
 * store itself (S3A's conditional create, {@code If-None-Match: *}). Delta-spark ships only
 * {@code S3SingleDriverLogStore}, which probes for the entry and then PUTs without a
 * condition: safe for one driver, while two drivers (a loader paused past its lease and the
 * one that took over) can both write version N, and the last PUT wins. Here the second is
 * refused with the {@code FileAlreadyExistsException} Delta's optimistic commit expects: it
 * reads the winner and retries or fails on the conflict.
 */
public final class ConditionalS3LogStore extends S3SingleDriverLogStore {
  public ConditionalS3LogStore(Configuration initHadoopConf) {
    super(initHadoopConf);
  }

  @Override
  public void write(
      Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
      throws IOException {
    if (overwrite) {
      super.write(path, actions, overwrite, hadoopConf);
      return;
    }
    FileSystem fs = path.getFileSystem(hadoopConf);
    FSDataOutputStreamBuilder<?, ?> builder = fs.createFile(path).overwrite(false).recursive();
    builder.must(AbortableCheckpointFileManager.CONDITIONAL_CREATE, true);
    FSDataOutputStream out = null;
    try {
      out = builder.build();
      while (actions.hasNext()) {
        out.write((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
      }
      FSDataOutputStream closing = out;
      out = null;
      closing.close(); // the PUT: refused by the store when the entry exists
    } catch (IOException e) {
      if (e instanceof InterruptedIOException || !exists(e)) {
        throw e;
      }
      java.nio.file.FileAlreadyExistsException refused =
          new java.nio.file.FileAlreadyExistsException(path.toString());
      refused.initCause(e);
      throw refused;
    } finally {
      if (out != null) {
        out.abort();
        out.close();
      }
    }
  }

  /** The store refused a create because the object exists (S3: 412 Precondition Failed). */
  static boolean exists(Throwable e) {
    for (Throwable at = e; at != null; at = at.getCause()) {
      String text = at.getClass().getName() + " " + at.getMessage();
      if (at instanceof org.apache.hadoop.fs.FileAlreadyExistsException
          || at instanceof java.nio.file.FileAlreadyExistsException
          || text.contains("412")
          || text.contains("PreconditionFailed")) {
        return true;
      }
    }
    return false;
  }
}
