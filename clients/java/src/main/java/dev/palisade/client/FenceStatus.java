// A namespace's high-water mark, as read.
package dev.palisade.client;

/**
 * A namespace's high-water mark ({@code GET /v1/fences/{lock}}).
 *
 * @param lock the namespace
 * @param highWater the largest epoch admitted (0 if none)
 * @param seq the sequence number admitted with it (sequence policy)
 * @param policy {@code epoch} or {@code sequence}
 */
public record FenceStatus(String lock, long highWater, long seq, String policy) {}
