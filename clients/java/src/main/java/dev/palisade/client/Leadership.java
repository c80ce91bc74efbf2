// Who leads an election, as an observer sees it.
package dev.palisade.client;

import java.util.Arrays;

/**
 * Who leads an election: the holder of its lock, its term (the lease's epoch, which is also
 * its fencing token's epoch) and what it advertises.
 *
 * @param leader the candidate leading
 * @param term the leader's epoch
 * @param value what the leader advertises (null when nothing)
 */
public record Leadership(String leader, long term, byte[] value) {
  public Leadership {
    value = value == null ? null : value.clone();
  }

  @Override
  public byte[] value() {
    return value == null ? null : value.clone();
  }

  @Override
  public boolean equals(Object other) {
    return other instanceof Leadership l && leader.equals(l.leader) && term == l.term && Arrays.equals(value, l.value);
  }

  @Override
  public int hashCode() {
    return 31 * (31 * leader.hashCode() + Long.hashCode(term)) + Arrays.hashCode(value);
  }

  @Override
  public String toString() {
    return "Leadership[" + leader + ", term " + Long.toUnsignedString(term) + (value == null ? "" : ", " + value.length + " bytes") + "]";
  }
}
