// The answer to a barrier.
package dev.palisade.client;

/**
 * The answer to a barrier ({@code POST /v1/fences/{lock}}): the namespace's high-water mark
 * now, at least {@code epoch}.
 *
 * @param lock the namespace
 * @param highWater its high-water mark after the barrier
 * @param epoch the epoch of the token that passed it
 */
public record Fenced(String lock, long highWater, long epoch) {}
