package cdc.spark;

import java.nio.charset.StandardCharsets;

/**
 * The Kafka partition a record's key goes to, as the producers' default partitioner picks
 * it for a keyed record (Kafka's BuiltInPartitioner.partitionForKey: the positive murmur2
 * hash of the key's bytes, modulo the partitions), so that a row the snapshot writes to a
 * store itself carries the partition its record and every later change of its key take.
 * Called from Spark SQL as {@code reflect('cdc.spark.KafkaPartitions', 'of', key, n)}: the
 * key is its text, whose UTF-8 bytes are the record's key (Spark's Kafka sink writes a
 * string key so).
 */
public final class KafkaPartitions {
  private KafkaPartitions() {}

  public static int of(String key, int partitions) {
    byte[] data = key.getBytes(StandardCharsets.UTF_8);
    return (murmur2(data) & 0x7fffffff) % partitions;
  }

  /** Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2), seed 0x9747b28c. */
  static int murmur2(byte[] data) {
    int length = data.length;
    int seed = 0x9747b28c;
    final int m = 0x5bd1e995;
    final int r = 24;
    int h = seed ^ length;
    int length4 = length / 4;
    for (int i = 0; i < length4; i++) {
      final int i4 = i * 4;
      int k =
          (data[i4] & 0xff)
              + ((data[i4 + 1] & 0xff) << 8)
              + ((data[i4 + 2] & 0xff) << 16)
              + ((data[i4 + 3] & 0xff) << 24);
      k *= m;
      k ^= k >>> r;
      k *= m;
      h *= m;
      h ^= k;
    }
    switch (length % 4) {
      case 3:
        h ^= (data[(length & ~3) + 2] & 0xff) << 16;
      case 2:
        h ^= (data[(length & ~3) + 1] & 0xff) << 8;
      case 1:
        h ^= data[length & ~3] & 0xff;
        h *= m;
    }
    h ^= h >>> 13;
    h *= m;
    h ^= h >>> 15;
    return h;
  }
}
