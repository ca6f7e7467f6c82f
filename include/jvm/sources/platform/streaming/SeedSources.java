package platform.streaming;

import java.util.List;
import java.util.Map;
import java.util.function.Supplier;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;
import org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat;
import org.apache.spark.sql.execution.datasources.v2.parquet.ParquetTable;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import scala.Option;
import scala.jdk.javaapi.CollectionConverters;

/**
 * The two streams of a seeded epoch (jobs/streaming/seed.py), planned in the JVM: no
 * Python process starts for them. Their offsets are written as the Python sources they
 * replace wrote them, so a checkpoint begun by those resumes here.
 *
 * <ul>
 *   <li>{@link Seed}: a one-shot stream of the rows of one Parquet file (the cut's
 *       snapshot). Offsets {"seeded": 0}, then {"seeded": 1}; the file is read by Spark's
 *       own Parquet scan. Options: path, schema (DDL).
 *   <li>{@link Hold}: Kafka's stand-in, a stream that stays at its starting offsets and
 *       reads nothing; its offset is the Kafka offsets JSON, which Spark's Kafka source
 *       resumes from on the same checkpoint. Option: startingOffsets.
 * </ul>
 */
public final class SeedSources {
  private SeedSources() {}

  /** What Spark's Kafka source gives (without headers): the hold's columns. */
  static final StructType KAFKA_COLUMNS =
      StructType.fromDDL(
          "key binary, value binary, topic string, partition int, offset long, "
              + "timestamp timestamp, timestampType int");

  /** An offset that is its JSON text (equal offsets: equal text, as Spark compares them). */
  static final class TextOffset extends Offset {
    private final String json;

    TextOffset(String json) {
      this.json = json;
    }

    @Override
    public String json() {
      return json;
    }
  }

  /** A stream table: its scan is itself and its stream is made by {@code stream}. */
  static Table streamTable(String name, StructType schema, Supplier<MicroBatchStream> stream) {
    return new SelfScannedTable(name, schema, TableCapability.MICRO_BATCH_READ) {
      @Override
      public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
        return stream.get();
      }
    };
  }

  /** A stream that plans nothing itself: only the one-shot and the held one below. */
  private abstract static class FixedStream implements MicroBatchStream, SupportsTriggerAvailableNow {
    @Override
    public Offset latestOffset() {
      throw new UnsupportedOperationException("latestOffset(start, limit) is used");
    }

    @Override
    public Offset deserializeOffset(String json) {
      return new TextOffset(json);
    }

    @Override
    public void prepareForTriggerAvailableNow() {}

    @Override
    public void commit(Offset end) {}

    @Override
    public void stop() {}
  }

  public static final class Seed implements TableProvider {
    // As Python's json.dumps wrote them.
    static final String BEFORE = "{\"seeded\": 0}";
    static final String AFTER = "{\"seeded\": 1}";
    private static final Pattern SEEDED = Pattern.compile("\\{\\s*\"seeded\"\\s*:\\s*([01])\\s*}");

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
      return StructType.fromDDL(required(options, "schema"));
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
      CaseInsensitiveStringMap options = new CaseInsensitiveStringMap(properties);
      String path = required(options, "path");
      SparkSession spark = SparkSession.active();
      return streamTable("platform_seed", schema, () -> new SeedStream(spark, path, schema));
    }

    static boolean seeded(Offset offset) {
      Matcher found = SEEDED.matcher(offset.json());
      if (!found.matches()) {
        throw new IllegalStateException("not a seed offset: " + offset.json());
      }
      return found.group(1).equals("1");
    }
  }

  private static final class SeedStream extends FixedStream {
    private final SparkSession spark;
    private final String path;
    private final StructType schema;
    private Batch file; // Spark's scan of the file, made when first planned

    SeedStream(SparkSession spark, String path, StructType schema) {
      this.spark = spark;
      this.path = path;
      this.schema = schema;
    }

    @Override
    public Offset initialOffset() {
      return new TextOffset(Seed.BEFORE);
    }

    @Override
    public Offset latestOffset(Offset start, ReadLimit limit) {
      return new TextOffset(Seed.AFTER);
    }

    @Override
    public InputPartition[] planInputPartitions(Offset start, Offset end) {
      if (!Seed.seeded(start) && Seed.seeded(end)) {
        return file().planInputPartitions();
      }
      return new InputPartition[0];
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
      return file().createReaderFactory();
    }

    private synchronized Batch file() {
      if (file == null) {
        CaseInsensitiveStringMap none = new CaseInsensitiveStringMap(Map.of());
        ParquetTable table =
            new ParquetTable(
                "platform_seed",
                spark,
                none,
                CollectionConverters.asScala(List.of(path)).toSeq(),
                Option.apply(schema),
                ParquetFileFormat.class);
        file = table.newScanBuilder(none).build().toBatch();
      }
      return file;
    }
  }

  public static final class Hold implements TableProvider {
    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
      return KAFKA_COLUMNS;
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
      String offsets = required(new CaseInsensitiveStringMap(properties), "startingOffsets");
      return streamTable("platform_hold", KAFKA_COLUMNS, () -> new HoldStream(offsets));
    }
  }

  /** Stays at its starting offsets (the Kafka offsets JSON) and plans nothing. */
  private static final class HoldStream extends FixedStream {
    private final String offsets;

    HoldStream(String offsets) {
      this.offsets = offsets;
    }

    @Override
    public Offset initialOffset() {
      return new TextOffset(offsets);
    }

    @Override
    public Offset latestOffset(Offset start, ReadLimit limit) {
      return start; // nothing ever becomes available
    }

    @Override
    public InputPartition[] planInputPartitions(Offset start, Offset end) {
      return new InputPartition[0];
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
      return partition -> {
        throw new UnsupportedOperationException("the hold plans no partition");
      };
    }
  }

  static String required(CaseInsensitiveStringMap options, String name) {
    String value = options.get(name);
    if (value == null || value.isEmpty()) {
      throw new IllegalArgumentException("the stream needs option " + name);
    }
    return value;
  }
}
