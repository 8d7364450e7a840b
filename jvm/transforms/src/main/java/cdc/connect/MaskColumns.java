package cdc.connect;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.Map;
import java.util.Set;
import java.util.function.UnaryOperator;
import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.common.config.types.Password;
import org.apache.kafka.connect.connector.ConnectRecord;
import org.apache.kafka.connect.data.Field;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.data.Struct;
import org.apache.kafka.connect.errors.DataException;
import org.apache.kafka.connect.transforms.Transformation;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Masks the columns a pipeline names (pipeline.table."schema.table".mask) in every change
 * event of the Debezium PostgreSQL connector before it reaches Kafka: in the message key,
 * and in the envelope's `before` and `after`.
 *
 * <ul>
 *   <li>{@code hash}: the hex SHA-256 of the salt's UTF-8 bytes followed by the value's
 *       (the snapshot and verify compute the same in PostgreSQL, cdc.mask_hash);
 *   <li>{@code redact}: a constant, or null.
 * </ul>
 *
 * A value equal to the pipeline's placeholder for an unchanged TOASTed value is left as it
 * is (it is not the column's value). A change event of a topic the settings do not name (a
 * change made under a passing name, a table renamed or moved out since the setup) is
 * published without its row images, its key's text values hashed: nothing leaves unmasked,
 * and capture goes on. `cdc status` reports such a topic (a stray) and says to backfill the
 * table its changes belong to.
 *
 * <p>A backfill's progress notification of a table whose key is masked names no key.
 *
 * <p>Settings: {@code masks} (JSON: "topics": topic -> column -> {"mode": "hash"} or
 * {"mode": "redact", "value": text or null}, every captured table's topic, with no column
 * when it masks none; "keyed": the tables whose key is masked), {@code salt} and {@code
 * placeholder} (secrets: the worker reads them from a file).
 */
public class MaskColumns<R extends ConnectRecord<R>> implements Transformation<R> {

  private static final Logger LOG = LoggerFactory.getLogger(MaskColumns.class);

  private static final ConfigDef CONFIG =
      new ConfigDef()
          .define("masks", ConfigDef.Type.STRING, ConfigDef.Importance.HIGH, "topic -> masks")
          .define("salt", ConfigDef.Type.PASSWORD, ConfigDef.Importance.HIGH, "hash salt")
          .define(
              "placeholder",
              ConfigDef.Type.PASSWORD,
              ConfigDef.Importance.HIGH,
              "unchanged TOAST placeholder");

  private record Mask(boolean hash, String value) {}

  private final Map<String, Map<String, Mask>> masks = new HashMap<>();
  // the tables ("schema.table") whose key is masked: a backfill's progress notification
  // names the key it has reached, which is left out for them
  private final Set<String> keyed = new HashSet<>();
  // the topics of no known table met so far (each is logged once)
  private final Set<String> unknown = new HashSet<>();
  private byte[] salt;
  private String placeholder;

  @Override
  public void configure(Map<String, ?> configs) {
    Map<String, Object> parsed = CONFIG.parse(configs);
    salt = ((Password) parsed.get("salt")).value().getBytes(StandardCharsets.UTF_8);
    placeholder = ((Password) parsed.get("placeholder")).value();
    try {
      JsonNode config = new ObjectMapper().readTree((String) parsed.get("masks"));
      for (JsonNode table : config.path("keyed")) {
        keyed.add(table.asText());
      }
      JsonNode root = config.path("topics");
      for (Iterator<Map.Entry<String, JsonNode>> t = root.fields(); t.hasNext(); ) {
        Map.Entry<String, JsonNode> topic = t.next();
        Map<String, Mask> columns = new HashMap<>();
        for (Iterator<Map.Entry<String, JsonNode>> c = topic.getValue().fields(); c.hasNext(); ) {
          Map.Entry<String, JsonNode> column = c.next();
          JsonNode spec = column.getValue();
          boolean hash = "hash".equals(spec.path("mode").asText());
          JsonNode value = spec.path("value");
          columns.put(
              column.getKey(), new Mask(hash, value.isTextual() ? value.asText() : null));
        }
        masks.put(topic.getKey(), columns);
      }
    } catch (Exception e) {
      throw new DataException("cdc mask: the masks setting is not valid JSON", e);
    }
  }

  @Override
  public R apply(R record) {
    if (!isTableEvent(record)) {
      return isNotification(record) ? withoutMaskedKeys(record) : record;
    }
    Map<String, Mask> columns = masks.get(record.topic());
    if (columns == null) {
      return withoutValues(record);
    }
    if (columns.isEmpty()) {
      return record;
    }
    Object key = record.key() instanceof Struct k ? masked(k, columns, record.topic()) : record.key();
    return withImages(record, key, row -> masked(row, columns, record.topic()));
  }

  /** The record with `key`, and its envelope's `before` and `after` rows through `image`. */
  private R withImages(R record, Object key, UnaryOperator<Struct> image) {
    Object value = record.value();
    if (value instanceof Struct envelope && envelope.schema().field("after") != null) {
      Struct out = new Struct(envelope.schema());
      for (Field field : envelope.schema().fields()) {
        Object part = envelope.get(field);
        boolean row = field.name().equals("before") || field.name().equals("after");
        out.put(field, row && part instanceof Struct struct ? image.apply(struct) : part);
      }
      value = out;
    }
    return record.newRecord(
        record.topic(),
        record.kafkaPartition(),
        record.keySchema(),
        key,
        record.valueSchema(),
        value,
        record.timestamp(),
        record.headers());
  }

  /**
   * A change of a topic the settings do not name: its `before` and `after` left out, and
   * each text value of its key hashed (which columns of it are masked is not known).
   */
  private R withoutValues(R record) {
    if (unknown.add(record.topic())) {
      LOG.warn(
          "cdc mask: topic {} names no table the pipeline knows (a change made under a passing"
              + " name?): its changes are published without their values; backfill the table"
              + " they belong to",
          record.topic());
    }
    Object key = record.key();
    if (key instanceof Struct k) {
      Struct out = new Struct(k.schema());
      for (Field field : k.schema().fields()) {
        Object value = k.get(field);
        out.put(field, value instanceof String text ? hash(text) : value);
      }
      key = out;
    }
    return withImages(record, key, row -> null);
  }

  private static boolean isNotification(ConnectRecord<?> record) {
    return record.value() instanceof Struct value
        && value.schema().field("aggregate_type") != null
        && value.schema().field("additional_data") != null;
  }

  /** A notification of a backfill of a table whose key is masked, without the keys. */
  private R withoutMaskedKeys(R record) {
    Struct value = (Struct) record.value();
    if (!(value.get("additional_data") instanceof Map<?, ?> data)) {
      return record;
    }
    Object table = data.get("current_collection_in_progress");
    if (table == null || !keyed.contains(table.toString())) {
      return record;
    }
    Map<Object, Object> kept = new HashMap<>(data);
    for (String field : new String[] {"maximum_key", "last_processed_key"}) {
      if (kept.containsKey(field)) {
        kept.put(field, "(masked)");
      }
    }
    Struct out = new Struct(value.schema());
    for (Field field : value.schema().fields()) {
      out.put(field, field.name().equals("additional_data") ? kept : value.get(field));
    }
    return record.newRecord(
        record.topic(),
        record.kafkaPartition(),
        record.keySchema(),
        record.key(),
        record.valueSchema(),
        out,
        record.timestamp(),
        record.headers());
  }

  /** A change event of a table (a tombstone too), not a heartbeat, transaction or message. */
  private static boolean isTableEvent(ConnectRecord<?> record) {
    Schema value = record.valueSchema();
    if (value != null) {
      return value.name() != null && value.name().endsWith(".Envelope");
    }
    Schema key = record.keySchema();
    return key != null && key.name() != null && key.name().endsWith(".Key");
  }

  private Struct masked(Struct row, Map<String, Mask> columns, String topic) {
    Struct out = new Struct(row.schema());
    for (Field field : row.schema().fields()) {
      Object value = row.get(field);
      Mask mask = columns.get(field.name());
      if (mask != null && value != null && !placeholder.equals(value)) {
        if (!mask.hash() && mask.value() == null) {
          if (!field.schema().isOptional()) {
            throw new DataException(
                "cdc mask: column " + field.name() + " of topic " + topic + " cannot be null");
          }
          value = null;
        } else if (value instanceof String text) {
          value = mask.hash() ? hash(text) : mask.value();
        } else {
          throw new DataException(
              "cdc mask: column " + field.name() + " of topic " + topic + " is not text");
        }
      }
      out.put(field, value);
    }
    return out;
  }

  private String hash(String text) {
    try {
      MessageDigest digest = MessageDigest.getInstance("SHA-256");
      digest.update(salt);
      byte[] sum = digest.digest(text.getBytes(StandardCharsets.UTF_8));
      StringBuilder hex = new StringBuilder(sum.length * 2);
      for (byte b : sum) {
        hex.append(Character.forDigit((b >> 4) & 0xf, 16)).append(Character.forDigit(b & 0xf, 16));
      }
      return hex.toString();
    } catch (NoSuchAlgorithmException e) {
      throw new DataException("cdc mask: no SHA-256 in this JVM", e);
    }
  }

  @Override
  public ConfigDef config() {
    return CONFIG;
  }

  @Override
  public void close() {}
}
