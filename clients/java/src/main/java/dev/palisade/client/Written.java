// The answer to a fenced write.
package dev.palisade.client;

/**
 * The answer to a fenced write.
 *
 * @param revision the key's new revision
 * @param epoch the epoch that wrote it
 */
public record Written(long revision, long epoch) {}
