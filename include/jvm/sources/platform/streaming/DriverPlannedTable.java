package platform.streaming;

import java.util.Set;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * A batch-read table that is its own scan and batch: the static side of a stream-static
 * join, whose input partitions are computed on the driver each time a micro-batch is
 * planned (BatchWatermarkSource, PinnedDeltaSource).
 */
abstract class DriverPlannedTable implements SupportsRead, ScanBuilder, Scan, Batch {
  private final String name;
  private final StructType schema;

  DriverPlannedTable(String name, StructType schema) {
    this.name = name;
    this.schema = schema;
  }

  @Override
  public String name() {
    return name;
  }

  @Override
  @SuppressWarnings("deprecation")
  public StructType schema() {
    return schema;
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
    return schema;
  }

  @Override
  public Batch toBatch() {
    return this;
  }
}
