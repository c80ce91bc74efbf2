// A key of the fenced store, as read.
package dev.palisade.client;

import java.util.Arrays;

/**
 * A key of the fenced store: its value, revision, and the epoch that wrote it.
 *
 * @param value the bytes stored
 * @param revision the key's revision (its ETag)
 * @param epoch the epoch of the write that stored it
 */
public record Entry(byte[] value, long revision, long epoch) {
  public Entry {
    value = value.clone();
  }

  @Override
  public byte[] value() {
    return value.clone();
  }

  @Override
  public boolean equals(Object other) {
    return other instanceof Entry e
        && Arrays.equals(value, e.value)
        && revision == e.revision
        && epoch == e.epoch;
  }

  @Override
  public int hashCode() {
    return 31 * (31 * Arrays.hashCode(value) + Long.hashCode(revision)) + Long.hashCode(epoch);
  }

  @Override
  public String toString() {
    return "Entry[" + value.length + " bytes, revision=" + revision + ", epoch=" + epoch + "]";
  }
}
