package platform.streaming;

import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.types.StructType;

/**
 * A batch-read table that is its own scan and batch: the static side of a stream-static
 * join, whose input partitions are computed on the driver each time a micro-batch is
 * planned (BatchClockSource, PinnedDeltaSource).
 */
abstract class DriverPlannedTable extends SelfScannedTable implements Batch {
  DriverPlannedTable(String name, StructType schema) {
    super(name, schema, TableCapability.BATCH_READ);
  }

  @Override
  public Batch toBatch() {
    return this;
  }
}
