// What a token says: its claims, as the verifier read them.
package dev.palisade.token;

/**
 * What a token says: holder {@code holder} acquired lock {@code lock} and was given epoch
 * {@code epoch}; {@code keyId} names the key that signed it.
 *
 * <p>The epoch is an unsigned 64-bit integer held in a {@code long}: compare epochs with
 * {@link Long#compareUnsigned} and print them with {@link Long#toUnsignedString(long)}.
 */
public record Claims(String lock, long epoch, String holder, String keyId) {}
