// A granted lock, as the server answered it.
package dev.palisade.client;

/**
 * A granted lock: its epoch and the signed token every write it guards carries. The epoch
 * is an unsigned 64-bit integer held in a {@code long} (compare with {@link
 * Long#compareUnsigned}).
 *
 * @param lock the lock
 * @param holder who holds it
 * @param epoch the ownership generation, per lock, never repeated
 * @param token the signed fencing token to attach to every write
 * @param leaseId the lease to renew and release
 * @param ttlMs how long the lease lives without a keepalive
 * @param lockDelayMs how long the lock stays closed if the lease expires
 */
public record Lease(
    String lock, String holder, long epoch, String token, String leaseId, long ttlMs, long lockDelayMs) {}
