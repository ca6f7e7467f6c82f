package platform.streaming;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * A Delta table as of the running micro-batch's planned time (see
 * jobs/streaming/dimensions.py): the newest version committed at or before the
 * batchTimestampMs of the newest offset log entry, read on the driver while the batch is
 * planned. A stream-static join plans its static side again for every micro-batch, so
 * each batch joins one version, and a replay of the batch (its offset log entry is
 * kept) joins the same one. Options: path (the Delta table), checkpoint (the query's),
 * or version (a fixed one, for recomputations in batch). Rows: the version and each
 * row as JSON (the table's schema is the caller's, checked before the run).
 */
public final class PinnedDeltaSource implements TableProvider {
  public static final String VERSION = "_dim_version";
  public static final String ROW = "_dim_row";
  private static final StructType SCHEMA =
      new StructType()
          .add(VERSION, DataTypes.LongType, false)
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
    return new PinnedTable(path, options.get("checkpoint"), options.getLong("version", -1L));
  }

  /** The newest version of the table at path committed at or before timeMs. */
  static long versionAt(SparkSession spark, String path, long timeMs) {
    String table = "delta.`" + path.replace("`", "``") + "`";
    List<Row> versions =
        spark
            .sql("DESCRIBE HISTORY " + table)
            .selectExpr("version", "unix_millis(timestamp) AS ms")
            .collectAsList();
    long found = -1;
    long oldest = Long.MAX_VALUE;
    for (Row row : versions) {
      long version = row.getLong(0);
      oldest = Math.min(oldest, version);
      if (row.getLong(1) <= timeMs) {
        found = Math.max(found, version);
      }
    }
    if (found < 0) {
      throw new IllegalStateException(
          "dimension table "
              + path
              + " has no version committed at or before the batch's planned time ("
              + timeMs
              + " ms; its oldest kept version is "
              + (oldest == Long.MAX_VALUE ? "none" : Long.toString(oldest))
              + ")");
    }
    return found;
  }

  /** The table, its scan and its batch at once: all it holds is where to read. */
  private static final class PinnedTable implements SupportsRead, ScanBuilder, Scan, Batch {
    private final String path;
    private final String checkpoint;
    private final long version;

    PinnedTable(String path, String checkpoint, long version) {
      this.path = path;
      this.checkpoint = checkpoint;
      this.version = version;
    }

    @Override
    public String name() {
      return "platform_pinned_delta";
    }

    @Override
    @SuppressWarnings("deprecation")
    public StructType schema() {
      return SCHEMA;
    }

    @Override
    public Set<TableCapability> capabilities() {
      return Set.of(TableCapability.BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
      return this;
    }

    @Override
    public Scan build() {
      return this;
    }

    @Override
    public StructType readSchema() {
      return SCHEMA;
    }

    @Override
    public Batch toBatch() {
      return this;
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
        long planned =
            BatchWatermarkSource.longField(
                BatchWatermarkSource.newestMetadata(checkpoint), "batchTimestampMs");
        chosen = versionAt(spark, path, planned);
      }
      List<String> rows =
          spark.read().format("delta").option("versionAsOf", chosen).load(path).toJSON().collectAsList();
      return new InputPartition[] {new Rows(chosen, new ArrayList<>(rows))};
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
      return new RowsReaderFactory();
    }
  }

  private static final class Rows implements InputPartition, Serializable {
    private static final long serialVersionUID = 1L;
    final long version;
    final ArrayList<String> rows;

    Rows(long version, ArrayList<String> rows) {
      this.version = version;
      this.rows = rows;
    }
  }

  private static final class RowsReaderFactory implements PartitionReaderFactory {
    private static final long serialVersionUID = 1L;

    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
      Rows rows = (Rows) partition;
      return new PartitionReader<InternalRow>() {
        private int at = -1;

        @Override
        public boolean next() {
          at += 1;
          return at < Math.max(rows.rows.size(), 1);
        }

        @Override
        public InternalRow get() {
          // An empty table still yields its version (with no row): the batch records it.
          String row = at < rows.rows.size() ? rows.rows.get(at) : null;
          return new GenericInternalRow(
              new Object[] {rows.version, row == null ? null : UTF8String.fromString(row)});
        }

        @Override
        public void close() {}
      };
    }
  }
}
