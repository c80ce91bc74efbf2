// A lock's status, as read.
package dev.palisade.client;

/**
 * A lock's status ({@code GET /v1/locks/{lock}}). While the lock is free the lease's fields
 * are null and {@code epoch} is the last one granted (0 if never).
 *
 * @param lock the lock
 * @param epoch its one epoch: the holder's, or the last granted
 * @param holder who holds it (null when free)
 * @param leaseId the live lease (null when free, or not the caller's with authentication on)
 * @param remainingMs how long the lease has left without a keepalive (null when free)
 * @param waiters how many wait in line
 * @param value what the holder advertises (null when none)
 * @param lockDelayMs the live lease's lock-delay (null when free)
 * @param session the live lease's session (null when none, or not the caller's)
 */
public record LockStatus(
    String lock,
    long epoch,
    String holder,
    String leaseId,
    Long remainingMs,
    long waiters,
    byte[] value,
    Long lockDelayMs,
    String session) {}
