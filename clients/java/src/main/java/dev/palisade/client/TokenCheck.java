// What the server says of a token.
package dev.palisade.client;

/**
 * The server's answer about a token ({@code POST /v1/tokens/check}): a snapshot, not a
 * fence (only a resource's high-water check at the moment of the write fences).
 *
 * @param genuine whether the token verifies here
 * @param reason why not, when it does not (else null)
 * @param lock the token's lock (null when not genuine)
 * @param epoch its epoch
 * @param holder its holder
 * @param keyId the key that signed it
 * @param currentEpoch the lock's epoch now
 * @param current whether the token's epoch is the lock's newest, with none above it unrecorded
 * @param leaseAlive whether the lock's live lease has this epoch
 */
public record TokenCheck(
    boolean genuine,
    String reason,
    String lock,
    long epoch,
    String holder,
    String keyId,
    long currentEpoch,
    boolean current,
    boolean leaseAlive) {}
