// A lock's high-water mark at one resource.
package dev.palisade.gate;

/**
 * The largest (epoch, seq) a resource has admitted for one lock; (0, 0) when none. Both
 * are non-negative: the fence table stores SQL integers, and the gate refuses a mark past
 * {@link Long#MAX_VALUE} rather than wrap it.
 */
public record HighWater(long epoch, long seq) {
  /** The mark of a lock never admitted. */
  public static final HighWater NONE = new HighWater(0, 0);
}
