package cdc.connect;

import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;
import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.connector.ConnectRecord;
import org.apache.kafka.connect.data.Struct;
import org.apache.kafka.connect.header.Header;
import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.transforms.Transformation;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * kafka.oversized = "dead_letter": a change event larger than Kafka takes goes to the
 * pipeline's dead-letter topic as a small letter (the table's topic, the key, the event's
 * position and size) instead of failing the connector's task, so that capture of every
 * other row goes on. The stores keep the row as it was before that event; `cdc verify`
 * lists its key and `cdc dlq replay`, once kafka.max_message_bytes is raised, backfills it.
 *
 * <p>The size is the event's as the worker's converter writes it (JSON without schemas):
 * key, value and headers, with a margin for the record's framing, against {@code max.bytes}
 * (the producer's max.request.size). Settings: {@code max.bytes}, {@code topic} (the
 * dead-letter topic).
 */
public class HoldOversized<R extends ConnectRecord<R>> implements Transformation<R> {

  private static final Logger LOG = LoggerFactory.getLogger(HoldOversized.class);

  // a record's framing in a batch (offsets, lengths, attributes): well under this
  static final int MARGIN = 1024;

  private static final ConfigDef CONFIG =
      new ConfigDef()
          .define("max.bytes", ConfigDef.Type.INT, ConfigDef.Importance.HIGH, "largest event")
          .define("topic", ConfigDef.Type.STRING, ConfigDef.Importance.HIGH, "dead-letter topic");

  private int maxBytes;
  private String topic;
  private final JsonConverter keys = new JsonConverter();
  private final JsonConverter values = new JsonConverter();

  @Override
  public void configure(Map<String, ?> configs) {
    Map<String, Object> parsed = CONFIG.parse(configs);
    maxBytes = (Integer) parsed.get("max.bytes");
    topic = (String) parsed.get("topic");
    Map<String, Object> json = new HashMap<>();
    json.put("schemas.enable", "false");
    json.put("converter.type", "key");
    keys.configure(json);
    json.put("converter.type", "value");
    values.configure(json);
  }

  @Override
  public R apply(R record) {
    if (record.value() == null
        || topic.equals(record.topic())
        || estimate(record.key()) + estimate(record.value()) + MARGIN <= maxBytes) {
      return record; // cannot be over, however its text is escaped: not written twice
    }
    byte[] key = keys.fromConnectData(record.topic(), record.keySchema(), record.key());
    byte[] value = values.fromConnectData(record.topic(), record.valueSchema(), record.value());
    long size = MARGIN + (key == null ? 0 : key.length) + (value == null ? 0 : value.length);
    for (Header header : record.headers()) {
      size += header.key().length() + String.valueOf(header.value()).length();
    }
    if (size <= maxBytes) {
      return record;
    }
    Map<String, Object> letter = new LinkedHashMap<>();
    letter.put("store", "capture");
    letter.put(
        "error",
        "a change event of "
            + size
            + " bytes is larger than kafka.max_message_bytes ("
            + maxBytes
            + " bytes): held back (kafka.oversized = dead_letter)");
    letter.put("topic", record.topic());
    letter.put("partition", -1);
    letter.put("offset", -1);
    letter.put("key", key == null ? null : new String(key, StandardCharsets.UTF_8));
    letter.put("value", null);
    letter.put("size", size);
    letter.put("position", position(record.value()));
    LOG.warn(
        "a change event of {} bytes to {} is over {} bytes: sent to {} (kafka.oversized)",
        size,
        record.topic(),
        maxBytes,
        topic);
    return record.newRecord(
        topic, null, null, key == null ? null : new String(key, StandardCharsets.UTF_8), null,
        letter, record.timestamp());
  }

  /**
   * An upper bound of a value's JSON size: every character of a text escaped at most six
   * times over (\\u0000), bytes as base64, each field's name and punctuation.
   */
  static long estimate(Object value) {
    if (value == null) {
      return 4;
    }
    if (value instanceof Struct struct) {
      long size = 2;
      for (org.apache.kafka.connect.data.Field field : struct.schema().fields()) {
        size += 6L * field.name().length() + 4 + estimate(struct.get(field));
      }
      return size;
    }
    if (value instanceof CharSequence text) {
      return 6L * text.length() + 2;
    }
    if (value instanceof byte[] bytes) {
      return 4L * bytes.length / 3 + 8;
    }
    if (value instanceof java.nio.ByteBuffer buffer) {
      return 4L * buffer.remaining() / 3 + 8;
    }
    if (value instanceof java.util.Collection<?> items) {
      long size = 2;
      for (Object item : items) {
        size += estimate(item) + 1;
      }
      return size;
    }
    if (value instanceof Map<?, ?> map) {
      long size = 2;
      for (Map.Entry<?, ?> entry : map.entrySet()) {
        size += estimate(String.valueOf(entry.getKey())) + estimate(entry.getValue()) + 2;
      }
      return size;
    }
    return 64; // a number, a boolean, a decimal or a time as Connect writes it
  }

  /** Where the event came from: the envelope's source position and commit time. */
  private static Map<String, Object> position(Object value) {
    Map<String, Object> out = new LinkedHashMap<>();
    if (value instanceof Struct envelope && envelope.schema().field("source") != null) {
      Object source = envelope.get("source");
      if (source instanceof Struct s) {
        for (String name : new String[] {"lsn", "sequence", "ts_ms", "schema", "table"}) {
          if (s.schema().field(name) != null) {
            out.put(name, s.get(name));
          }
        }
      }
      if (envelope.schema().field("op") != null) {
        out.put("op", envelope.get("op"));
      }
    }
    return out;
  }

  @Override
  public ConfigDef config() {
    return CONFIG;
  }

  @Override
  public void close() {
    keys.close();
    values.close();
  }
}
