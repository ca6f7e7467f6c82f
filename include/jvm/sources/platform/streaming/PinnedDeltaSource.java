package platform.streaming;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.delta.DeltaLog;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * A Delta table as of the running micro-batch's planned time (see
 * jobs/streaming/enrichment.py): the newest version committed at or before the
 * batchTimestampMs of the newest offset log entry, read on the driver while the batch is
 * planned. A stream-static join plans its static side again for every micro-batch, so
 * each batch joins one version, and a replay of the batch (its offset log entry is
 * kept, and the version chosen is recorded under checkpoint/dimensions) joins the same
 * one. Options: path (the Delta table), checkpoint (the query's), or version (a fixed
 * one, for recomputations in batch); schema and key (the columns the run was checked
 * with: a version whose columns changed type is an error, never NULLs). One row: the
 * version, the table's id (Delta's metaData.id: a table deleted and loaded again at the
 * same path is another table) and a JSON object of the table's rows by key (a key cast
 * to a string, each row's columns as JSON, timestamps to the microsecond).
 */
public final class PinnedDeltaSource implements TableProvider {
  public static final String VERSION = "_dim_version";
  public static final String ROW = "_dim_row";
  public static final String TABLE = "_dim_table";
  /** The largest table read, as its JSON rows (PLATFORM_DIMENSION_MAX_BYTES). */
  static final long DEFAULT_MAX_BYTES = 64L << 20;
  private static final StructType SCHEMA =
      new StructType()
          .add(VERSION, DataTypes.LongType, false)
          .add(TABLE, DataTypes.StringType, false)
          .add(ROW, DataTypes.StringType, true);

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return SCHEMA;
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    CaseInsensitiveStringMap options = new CaseInsensitiveStringMap(properties);
    String path = options.get("path");
    if (path == null || path.isEmpty()) {
      throw new IllegalArgumentException("the pinned Delta source needs option path");
    }
    if (options.get("key") == null || options.get("key").isEmpty()) {
      throw new IllegalArgumentException("the pinned Delta source needs option key");
    }
    return new PinnedTable(
        path,
        options.get("checkpoint"),
        options.getLong("version", -1L),
        options.get("schema"),
        options.get("key"),
        options.getLong("maxBytes", DEFAULT_MAX_BYTES));
  }

  /**
   * The version the batch joins: the one recorded for it under the checkpoint (its
   * version, path and table id: what the ledger records for the batch), else the newest
   * committed at or before its planned time, recorded there before it is used (a replay
   * reads it back instead of choosing again from commit times, so that Spark's state
   * after the replay is what the first run's changes recorded). A record of another
   * table (deleted and loaded again since) cannot be joined again: an error naming the
   * repair, a rebuild (the state from Delta at the last committed batch, a new checkpoint).
   */
  static long versionForBatch(SparkSession spark, String path, String checkpoint) {
    BatchClockSource.Entry entry = BatchClockSource.newestEntry(checkpoint);
    String name = entry.batchId + "-" + Integer.toHexString(path.hashCode());
    Path file = new Path(new Path(checkpoint, "dimensions"), name);
    try {
      FileSystem fs = file.getFileSystem(spark.sparkContext().hadoopConfiguration());
      if (fs.exists(file)) {
        try (BufferedReader reader =
            new BufferedReader(new InputStreamReader(fs.open(file), StandardCharsets.UTF_8))) {
          long recorded = Long.parseLong(reader.readLine().trim());
          reader.readLine(); // the path, as the file's name hashes it
          String id = reader.readLine();
          String now = id == null ? null : tableIdOrNull(spark, path, recorded);
          if (id == null || id.equals(now)) {
            return recorded;
          }
          throw new PlatformError(
              "dimension table "
                  + path
                  + " no longer holds what batch "
                  + entry.batchId
                  + " joined before the run stopped (table id "
                  + id
                  + " version "
                  + recorded
                  + " recorded; "
                  + (now == null
                      ? "that version cannot be read now: removed, or the table was deleted"
                          + " and loaded again"
                      : "table id " + now + " there now: it was deleted and loaded again")
                  + "), so Spark cannot run the batch again as it ran; repair: rebuild"
                  + " (restores the state from Delta at the last committed batch), then run");
        }
      }
      long planned = BatchClockSource.longField(entry.metadata, "batchTimestampMs");
      long chosen = versionAt(spark, path, planned);
      String id = tableId(spark, path, chosen);
      Path tmp = new Path(file.getParent(), "." + name + ".tmp");
      try (FSDataOutputStream out = fs.create(tmp, true)) {
        out.write((chosen + "\n" + path + "\n" + id + "\n").getBytes(StandardCharsets.UTF_8));
      }
      if (!fs.rename(tmp, file) && !fs.exists(file)) {
        throw new IOException("could not record the version in " + file);
      }
      return chosen;
    } catch (IOException e) {
      throw new UncheckedIOException("recording the dimension version in " + file, e);
    }
  }

  /** Delta's id of the table at path as of version (metaData.id), read once per commit. */
  static String tableId(SparkSession spark, String path, long version) {
    String commit = path + "\n" + version + "\n" + commitTime(spark, path, version);
    String known = IDS.get(commit);
    if (known != null) {
      return known;
    }
    DeltaLog log = DeltaLog.forTable(spark, path);
    String id =
        log.getSnapshotAt(
                version,
                log.getSnapshotAt$default$2(),
                log.getSnapshotAt$default$3(),
                log.getSnapshotAt$default$4())
            .metadata()
            .id();
    IDS.put(commit, id);
    return id;
  }

  private static String tableIdOrNull(SparkSession spark, String path, long version) {
    try {
      return tableId(spark, path, version);
    } catch (RuntimeException e) {
      return null; // that version is gone: another table, or one cleaned
    }
  }

  /**
   * What a batch read of a version gave, by table, version, the commit file's time (a
   * version is immutable, a table deleted and written again is not the same table), the
   * columns and the key: each batch that joins an unchanged table then costs no Spark job.
   * Small tables, few kept.
   */
  private static final Map<String, Read> ROWS = lru(16);

  /** A version as read: the table's id and its rows by key (one JSON object). */
  record Read(String tableId, String rows) {}

  private static final Map<String, List<Row>> HISTORIES = lru(16);

  private static final Map<String, String> IDS = lru(64);

  private static <V> Map<String, V> lru(int size) {
    return java.util.Collections.synchronizedMap(
        new java.util.LinkedHashMap<String, V>(size, 0.75f, true) {
          private static final long serialVersionUID = 1L;

          @Override
          protected boolean removeEldestEntry(Map.Entry<String, V> eldest) {
            return size() > size;
          }
        });
  }

  /** The newest commit file of the table's log and its time: what identifies its state. */
  static String logState(SparkSession spark, String path) {
    Path log = new Path(path, "_delta_log");
    try {
      FileSystem fs = log.getFileSystem(spark.sparkContext().hadoopConfiguration());
      String newest = "";
      long time = 0;
      for (org.apache.hadoop.fs.FileStatus status : fs.listStatus(log)) {
        String name = status.getPath().getName();
        if (name.matches("\\d{20}\\.json") && name.compareTo(newest) > 0) {
          newest = name;
          time = status.getModificationTime();
        }
      }
      return newest + "@" + time;
    } catch (IOException e) {
      return "unreadable-" + System.nanoTime(); // never a hit: Spark's read says why
    }
  }

  static long commitTime(SparkSession spark, String path, long version) {
    Path commit = new Path(new Path(path, "_delta_log"), String.format("%020d.json", version));
    try {
      return commit.getFileSystem(spark.sparkContext().hadoopConfiguration())
          .getFileStatus(commit)
          .getModificationTime();
    } catch (IOException e) {
      return -System.nanoTime(); // (a checkpointed-away commit file: read again)
    }
  }

  /** The table at version, after checking its columns against the run's. */
  static Read rowsAt(
      SparkSession spark, String path, long version, String schema, String key, long maxBytes) {
    String id =
        String.join(
            "\n", path, Long.toString(version), Long.toString(commitTime(spark, path, version)),
            String.valueOf(schema), key, Long.toString(maxBytes)); // a lower limit checks again
    Read known = ROWS.get(id);
    if (known != null) {
      return known;
    }
    String rows = readRows(spark, path, version, schema, key, maxBytes);
    Read read = new Read(tableId(spark, path, version), rows);
    ROWS.put(id, read);
    return read;
  }

  private static String readRows(
      SparkSession spark, String path, long version, String schema, String key, long maxBytes) {
    Dataset<Row> table = spark.read().format("delta").option("versionAsOf", version).load(path);
    if (schema != null && !schema.isEmpty()) {
      StructType expected = (StructType) DataType.fromJson(schema);
      StructType found = table.schema();
      for (StructField field : expected.fields()) {
        boolean present = java.util.Arrays.asList(found.fieldNames()).contains(field.name());
        if (!present && field.name().equals(key)) {
          throw new PlatformError(
              "dimension table " + path + " version " + version + " has no key column " + key);
        }
        if (present && !found.apply(field.name()).dataType().sameType(field.dataType())) {
          throw new PlatformError(
              "dimension table "
                  + path
                  + " version "
                  + version
                  + ": column "
                  + field.name()
                  + " is a "
                  + found.apply(field.name()).dataType().simpleString()
                  + ", the run was checked with a "
                  + field.dataType().simpleString()
                  + "; restart the run (it checks the table again)");
        }
      }
    }
    Map<String, String> options = new HashMap<>();
    options.put("timestampFormat", TIMESTAMP_FORMAT);
    options.put("timestampNTZFormat", TIMESTAMP_NTZ_FORMAT);
    // Grouped here by the key as Spark casts it to a string (the join casts the record's
    // key the same way): the batch gets one row, its map, with no shuffle of its own.
    Dataset<Row> pairs =
        table.select(
            functions.col(key).cast("string").alias("k"),
            functions.to_json(functions.struct(functions.col("*")), options).alias("v"));
    // Measured by Spark before anything reaches the driver (a job, once per version
    // read): the map built below is about this size.
    Row size =
        pairs
            .agg(
                functions.sum(
                    functions
                        .octet_length(functions.col("k"))
                        .plus(functions.octet_length(functions.col("v")))
                        .plus(6)))
            .first();
    long measured = size.isNullAt(0) ? 0L : size.getLong(0);
    if (measured > maxBytes) {
      throw tooLarge(path, version, measured, maxBytes);
    }
    List<Row> rows = pairs.collectAsList();
    Map<String, List<String>> byKey = new java.util.TreeMap<>();
    for (Row row : rows) {
      if (!row.isNullAt(0)) {
        byKey.computeIfAbsent(row.getString(0), k -> new ArrayList<>()).add(row.getString(1));
      }
    }
    com.fasterxml.jackson.core.io.JsonStringEncoder quote =
        com.fasterxml.jackson.core.io.JsonStringEncoder.getInstance();
    StringBuilder json = new StringBuilder("{");
    for (Map.Entry<String, List<String>> entry : byKey.entrySet()) {
      if (json.length() > 1) {
        json.append(',');
      }
      json.append('"').append(quote.quoteAsString(entry.getKey())).append("\":[");
      json.append(String.join(",", entry.getValue())).append(']');
    }
    return json.append('}').toString();
  }

  private static PlatformError tooLarge(String path, long version, long size, long maxBytes) {
    return new PlatformError(
        "dimension table "
            + path
            + " version "
            + version
            + " is over "
            + bytes(size)
            + " as JSON rows, past the limit of "
            + bytes(maxBytes)
            + " for a table every batch joins from the driver's memory; nothing of the"
            + " batch was written: make the table smaller, or raise"
            + " PLATFORM_DIMENSION_MAX_BYTES (and PLATFORM_SPARK_DRIVER_MEMORY with it)");
  }

  private static String bytes(long size) {
    return size >= 1L << 20
        ? (size >> 20) + " MiB"
        : size >= 1L << 10 ? (size >> 10) + " KiB" : size + " bytes";
  }

  /** Microseconds kept (Spark's default JSON format has milliseconds). */
  public static final String TIMESTAMP_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX";
  public static final String TIMESTAMP_NTZ_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSSSS";

  /** The newest version of the table at path committed at or before timeMs, else its oldest. */
  static long versionAt(SparkSession spark, String path, long timeMs) {
    String table = "delta.`" + path.replace("`", "``") + "`";
    // Delta's own history (its commit times), read again only when the log changed.
    String state = path + "\n" + logState(spark, path);
    List<Row> versions = HISTORIES.get(state);
    if (versions == null) {
      versions =
          spark
              .sql("DESCRIBE HISTORY " + table)
              .selectExpr("version", "unix_millis(timestamp) AS ms")
              .collectAsList();
      HISTORIES.put(state, versions);
    }
    long found = -1;
    long oldest = Long.MAX_VALUE;
    for (Row row : versions) {
      long version = row.getLong(0);
      oldest = Math.min(oldest, version);
      if (row.getLong(1) <= timeMs) {
        found = Math.max(found, version);
      }
    }
    if (found < 0 && oldest != Long.MAX_VALUE) {
      // A batch planned before the table's kept history (before the table existed:
      // a pipeline version without this enrichment planned it, and it runs again
      // after enrich: was added; or planned long ago and never run): no version was
      // recorded for it, so this is its first choice, recorded like any other.
      return oldest;
    }
    if (found < 0) {
      throw new PlatformError("dimension table " + path + " has no version");
    }
    return found;
  }

  /** The table, its scan and its batch at once: all it holds is where to read. */
  private static final class PinnedTable extends DriverPlannedTable {
    private final String path;
    private final String checkpoint;
    private final long version;
    private final String schema;
    private final String key;
    private final long maxBytes;

    PinnedTable(
        String path, String checkpoint, long version, String schema, String key, long maxBytes) {
      super("platform_pinned_delta", SCHEMA);
      this.maxBytes = maxBytes;
      this.path = path;
      this.checkpoint = checkpoint;
      this.version = version;
      this.schema = schema;
      this.key = key;
    }

    /** Called once per planned batch: the version, then its rows, read on the driver. */
    @Override
    public InputPartition[] planInputPartitions() {
      SparkSession spark = SparkSession.active();
      long chosen = version;
      if (chosen < 0) {
        if (checkpoint == null || checkpoint.isEmpty()) {
          throw new IllegalArgumentException("the pinned Delta source needs checkpoint or version");
        }
        chosen = versionForBatch(spark, path, checkpoint);
      }
      Read read = rowsAt(spark, path, chosen, schema, key, maxBytes);
      return new InputPartition[] {new Rows(chosen, read.tableId(), read.rows())};
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
      return new RowsReaderFactory();
    }
  }

  private static final class Rows implements InputPartition, Serializable {
    private static final long serialVersionUID = 1L;
    final long version;
    final String tableId;
    final String rows;

    Rows(long version, String tableId, String rows) {
      this.version = version;
      this.tableId = tableId;
      this.rows = rows;
    }
  }

  private static final class RowsReaderFactory implements PartitionReaderFactory {
    private static final long serialVersionUID = 1L;

    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
      Rows rows = (Rows) partition;
      return DriverPlannedTable.oneRow(
          new GenericInternalRow(
              new Object[] {
                rows.version,
                UTF8String.fromString(rows.tableId),
                UTF8String.fromString(rows.rows)
              }));
    }
  }
}
