package platform.streaming;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.PartitionReader;
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

  /** A reader of one row: what the one partition of such a table holds. */
  static PartitionReader<InternalRow> oneRow(InternalRow row) {
    return new PartitionReader<InternalRow>() {
      private boolean done;

      @Override
      public boolean next() {
        boolean first = !done;
        done = true;
        return first;
      }

      @Override
      public InternalRow get() {
        return row;
      }

      @Override
      public void close() {}
    };
  }
}
