package platform.streaming;

import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.SparkContext;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * The running micro-batch's event-time watermark as a one-row table (see
 * jobs/streaming/batch_watermark.py): a stream-static join plans its static side again
 * for every micro-batch, after Spark wrote the batch's offset log entry, so the newest
 * entry is the running batch's. The driver reads it while planning; the one task only
 * returns the number. Options: checkpoint (the query's checkpoint folder), floorMs.
 */
public final class BatchWatermarkSource implements TableProvider {
  public static final String COLUMN = "_batch_watermark_ms";
  private static final StructType SCHEMA =
      new StructType().add(COLUMN, DataTypes.LongType, false);
  private static final ObjectMapper JSON =
      new ObjectMapper().enable(DeserializationFeature.FAIL_ON_TRAILING_TOKENS);

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return SCHEMA;
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    CaseInsensitiveStringMap options = new CaseInsensitiveStringMap(properties);
    String checkpoint = options.get("checkpoint");
    if (checkpoint == null || checkpoint.isEmpty()) {
      throw new IllegalArgumentException("the batch watermark source needs option checkpoint");
    }
    return new WatermarkTable(checkpoint, options.getLong("floorMs", 0L));
  }

  /** The newest offset log entry's batchWatermarkMs, at least floorMs. */
  static long read(String checkpoint, long floorMs) {
    return Math.max(watermarkOf(newestMetadata(checkpoint)), floorMs);
  }

  /** An offset log entry: its batch id and metadata. */
  static final class Entry {
    final long batchId;
    final JsonNode metadata;

    Entry(long batchId, JsonNode metadata) {
      this.batchId = batchId;
      this.metadata = metadata;
    }
  }

  static JsonNode newestMetadata(String checkpoint) {
    return newestEntry(checkpoint).metadata;
  }

  /**
   * The newest offset log entry: the running batch's. An entry that is not Spark's (no
   * end offsets, metadata that is not one JSON object) is an error.
   */
  static Entry newestEntry(String checkpoint) {
    Path offsets = new Path(checkpoint, "offsets");
    try {
      FileSystem fs = offsets.getFileSystem(SparkContext.getOrCreate().hadoopConfiguration());
      long newest = -1;
      if (fs.exists(offsets)) {
        for (FileStatus status : fs.listStatus(offsets)) {
          String name = status.getPath().getName();
          if (!name.isEmpty() && name.chars().allMatch(Character::isDigit)) {
            newest = Math.max(newest, Long.parseLong(name));
          }
        }
      }
      if (newest < 0) {
        throw new IllegalStateException(
            "no offset log entry in " + offsets + " for the running batch");
      }
      Path entry = new Path(offsets, Long.toString(newest));
      try (BufferedReader reader =
          new BufferedReader(new InputStreamReader(fs.open(entry), StandardCharsets.UTF_8))) {
        reader.readLine(); // the version line
        String metadata = reader.readLine();
        String endOffsets = reader.readLine();
        JsonNode node = null;
        if (metadata != null && endOffsets != null) {
          try {
            node = JSON.readTree(metadata);
          } catch (IOException e) {
            node = null;
          }
        }
        if (node == null || !node.isObject()) {
          throw new IllegalStateException("unreadable offset log entry " + entry);
        }
        return new Entry(newest, node);
      }
    } catch (IOException e) {
      throw new UncheckedIOException("reading the offset log in " + offsets, e);
    }
  }

  /** A whole-number field of an entry's metadata; absent: 0 (Spark writes both it reads). */
  static long longField(JsonNode metadata, String field) {
    JsonNode value = metadata.get(field);
    if (value == null) {
      return 0L;
    }
    if (!value.isIntegralNumber() || !value.canConvertToLong()) {
      throw new IllegalStateException("unreadable offset log entry: " + field + " is " + value);
    }
    return value.asLong();
  }

  /** The entry's batchWatermarkMs, as jobs/streaming/offset_log.py reads it. */
  static long watermarkOf(JsonNode metadata) {
    return longField(metadata, "batchWatermarkMs");
  }

  /** The table, its scan and its batch at once: all it holds is where to read. */
  private static final class WatermarkTable extends DriverPlannedTable {
    private final String checkpoint;
    private final long floorMs;

    WatermarkTable(String checkpoint, long floorMs) {
      super("platform_batch_watermark", SCHEMA);
      this.checkpoint = checkpoint;
      this.floorMs = floorMs;
    }

    /** Called once per planned batch: the entry Spark wrote just before planning it. */
    @Override
    public InputPartition[] planInputPartitions() {
      return new InputPartition[] {new Watermark(read(checkpoint, floorMs))};
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
      return new WatermarkReaderFactory();
    }
  }

  private static final class Watermark implements InputPartition {
    private static final long serialVersionUID = 1L;
    final long watermarkMs;

    Watermark(long watermarkMs) {
      this.watermarkMs = watermarkMs;
    }
  }

  private static final class WatermarkReaderFactory implements PartitionReaderFactory {
    private static final long serialVersionUID = 1L;

    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
      long watermarkMs = ((Watermark) partition).watermarkMs;
      return new PartitionReader<InternalRow>() {
        private boolean done;

        @Override
        public boolean next() {
          boolean more = !done;
          done = true;
          return more;
        }

        @Override
        public InternalRow get() {
          return new GenericInternalRow(new Object[] {watermarkMs});
        }

        @Override
        public void close() {}
      };
    }
  }
}
