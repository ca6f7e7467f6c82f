// The Kafka Streams reference application of benchmarks/anchors.py: clicks per user
// per 1-minute tumbling event-time window (10 minutes' grace), exactly-once v2, RocksDB,
// the counts sent to an output topic. It runs until every input record is committed,
// then closes and prints one JSON line of timings. The output topic must exist.
// With "follow" last (benchmarks/latency.py) it runs until killed instead, and
// prints a JSON line {"t_ms": ..., "offsets": {partition: offset}} each time its
// committed input offsets move: when a transaction's counts became visible.
//
//   java -cp <jars> ClickCounts BOOTSTRAP INPUT OUTPUT APPLICATION_ID STATE_DIR THREADS
//        COMMIT_INTERVAL_MS [follow]
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.stream.Collectors;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.processor.TimestampExtractor;

public final class ClickCounts {
  private static final ObjectMapper JSON = new ObjectMapper();

  /** The event's time: its payload's "timestamp", in epoch seconds. */
  public static final class EventTime implements TimestampExtractor {
    @Override
    public long extract(ConsumerRecord<Object, Object> record, long partitionTime) {
      try {
        JsonNode event = JSON.readTree((String) record.value());
        return event.get("timestamp").asLong() * 1000L;
      } catch (Exception e) {
        throw new IllegalArgumentException("not a click event: " + record.value(), e);
      }
    }
  }

  /** Prints the group's committed offsets whenever they move (polled every 10 ms;
   * the time is taken when the answer arrives: at most one poll late). */
  static void followCommits(Admin admin, String appId) throws Exception {
    Map<Integer, Long> last = new HashMap<>();
    while (true) {
      Map<TopicPartition, OffsetAndMetadata> committed =
          admin.listConsumerGroupOffsets(appId).partitionsToOffsetAndMetadata().get();
      long now = System.currentTimeMillis();
      Map<Integer, Long> moved = new HashMap<>();
      for (Map.Entry<TopicPartition, OffsetAndMetadata> e : committed.entrySet()) {
        long offset = e.getValue().offset();
        if (!Long.valueOf(offset).equals(last.get(e.getKey().partition()))) {
          moved.put(e.getKey().partition(), offset);
        }
      }
      if (!moved.isEmpty()) {
        last.putAll(moved);
        String offsets = moved.entrySet().stream()
            .map(e -> "\"" + e.getKey() + "\": " + e.getValue())
            .collect(Collectors.joining(", "));
        System.out.println("{\"t_ms\": " + now + ", \"offsets\": {" + offsets + "}}");
        System.out.flush();
      }
      Thread.sleep(10);
    }
  }

  public static void main(String[] args) throws Exception {
    long started = System.nanoTime();
    String bootstrap = args[0], input = args[1], output = args[2], appId = args[3];
    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
    props.put(StreamsConfig.STATE_DIR_CONFIG, args[4]);
    props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.parseInt(args[5]));
    props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, Long.parseLong(args[6]));
    props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
    // The platform's fetch settings for Spark's reads, given here too: measured, no
    // worse for Kafka Streams, and within its noise of better.
    props.put(StreamsConfig.consumerPrefix("max.poll.records"), "10000");
    props.put(StreamsConfig.consumerPrefix("max.partition.fetch.bytes"), String.valueOf(4 << 20));

    StreamsBuilder builder = new StreamsBuilder();
    builder.stream(
            input,
            Consumed.with(Serdes.String(), Serdes.String()).withTimestampExtractor(new EventTime()))
        .groupByKey()
        .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMinutes(1), Duration.ofMinutes(10)))
        .count()
        .toStream()
        .map((window, count) -> KeyValue.pair(
            window.key() + "@" + window.window().start(), count.toString()))
        .to(output, Produced.with(Serdes.String(), Serdes.String()));

    Map<TopicPartition, Long> ends;
    try (Admin admin = Admin.create(Map.of(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap))) {
      var partitions = admin.describeTopics(java.util.List.of(input)).allTopicNames().get()
          .get(input).partitions().stream()
          .map(p -> new TopicPartition(input, p.partition()))
          .collect(Collectors.toMap(tp -> tp, tp -> OffsetSpec.latest()));
      ends = new HashMap<>();
      for (Map.Entry<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> e :
          admin.listOffsets(partitions).all().get().entrySet()) {
        ends.put(e.getKey(), e.getValue().offset());
      }
      KafkaStreams streams = new KafkaStreams(builder.build(), props);
      streams.setUncaughtExceptionHandler(e -> {
        e.printStackTrace();
        System.exit(2);  // a failed run is no measurement
        return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
      });
      long starting = System.nanoTime();
      streams.start();
      if (args.length > 7 && args[7].equals("follow")) {
        followCommits(admin, appId);
        return;
      }
      long firstCommit = -1;
      while (true) {  // done when the group has committed every input record
        Map<TopicPartition, OffsetAndMetadata> committed =
            admin.listConsumerGroupOffsets(appId).partitionsToOffsetAndMetadata().get();
        if (firstCommit < 0 && !committed.isEmpty()) {
          firstCommit = System.nanoTime();
        }
        boolean done = ends.entrySet().stream().allMatch(e -> {
          OffsetAndMetadata at = committed.get(e.getKey());
          return e.getValue() == 0 || (at != null && at.offset() >= e.getValue());
        });
        if (done) {
          break;
        }
        Thread.sleep(50);
      }
      long processed = System.nanoTime();
      streams.close(Duration.ofSeconds(60));
      long closed = System.nanoTime();
      System.out.printf(
          "{\"start_s\": %.3f, \"first_commit_s\": %.3f, \"processed_s\": %.3f, \"closed_s\": %.3f}%n",
          (starting - started) / 1e9, (firstCommit - started) / 1e9,
          (processed - started) / 1e9, (closed - started) / 1e9);
    }
  }
}
