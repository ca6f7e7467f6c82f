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
 * The running micro-batch's event-time watermark and batch time as a one-row table (see
 * jobs/streaming/batch_clock.py): a stream-static join plans its static side again for
 * every micro-batch, after Spark wrote the batch's offset log entry, so the newest entry
 * is the running batch's. The driver reads it while planning; the one task only returns
 * the numbers. Options: checkpoint (the query's checkpoint folder), floorMs (the lowest
 * watermark).
 */
public final class BatchClockSource implements TableProvider {
  public static final String WATERMARK_COLUMN = "_batch_watermark_ms";
  public static final String TIME_COLUMN = "_batch_time_ms";
  private static final StructType SCHEMA =
      new StructType()
          .add(WATERMARK_COLUMN, DataTypes.LongType, false)
          .add(TIME_COLUMN, DataTypes.LongType, false);
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
      throw new IllegalArgumentException("the batch clock source needs option checkpoint");
    }
    return new ClockTable(checkpoint, options.getLong("floorMs", 0L));
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
  private static final class ClockTable extends DriverPlannedTable {
    private final String checkpoint;
    private final long floorMs;

    ClockTable(String checkpoint, long floorMs) {
      super("platform_batch_clock", SCHEMA);
      this.checkpoint = checkpoint;
      this.floorMs = floorMs;
    }

    /**
     * Called once per planned batch: the entry Spark wrote just before planning it. Its
     * batchWatermarkMs (at least floorMs) and batchTimestampMs, the time Spark's
     * current_timestamp() gives the batch, on a replay too.
     */
    @Override
    public InputPartition[] planInputPartitions() {
      JsonNode metadata = newestMetadata(checkpoint);
      long watermarkMs = Math.max(watermarkOf(metadata), floorMs);
      long batchTimeMs = longField(metadata, "batchTimestampMs");
      if (batchTimeMs <= 0) {
        // A batch time of 0 would put every record "ahead of the batch time".
        throw new IllegalStateException("unreadable offset log entry: no batchTimestampMs");
      }
      return new InputPartition[] {new Clock(watermarkMs, batchTimeMs)};
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
      return new ClockReaderFactory();
    }
  }

  private static final class Clock implements InputPartition {
    private static final long serialVersionUID = 1L;
    final long watermarkMs;
    final long batchTimeMs;

    Clock(long watermarkMs, long batchTimeMs) {
      this.watermarkMs = watermarkMs;
      this.batchTimeMs = batchTimeMs;
    }
  }

  private static final class ClockReaderFactory implements PartitionReaderFactory {
    private static final long serialVersionUID = 1L;

    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
      Clock clock = (Clock) partition;
      return DriverPlannedTable.oneRow(
          new GenericInternalRow(new Object[] {clock.watermarkMs, clock.batchTimeMs}));
    }
  }
}
