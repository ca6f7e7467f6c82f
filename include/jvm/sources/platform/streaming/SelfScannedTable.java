package platform.streaming;

import java.util.Set;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * A table that is its own scan builder and scan, read one way (its one capability): the
 * platform's sources take no pushdown, so the options alone decide what is read.
 */
abstract class SelfScannedTable implements SupportsRead, ScanBuilder, Scan {
  private final String name;
  private final StructType schema;
  private final TableCapability capability;

  SelfScannedTable(String name, StructType schema, TableCapability capability) {
    this.name = name;
    this.schema = schema;
    this.capability = capability;
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
    return Set.of(capability);
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
}
