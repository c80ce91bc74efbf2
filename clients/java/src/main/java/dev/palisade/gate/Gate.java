// What every Java gate shares: the token check first, the gate rule, the refusals.
package dev.palisade.gate;

import dev.palisade.client.PalisadeException;
import dev.palisade.token.Claims;
import dev.palisade.token.TokenException;
import dev.palisade.token.Verifier;
import java.util.Map;

/**
 * What every gate shares, the same as the Rust palisade-adapters crate and the Python and
 * Go gates (docs/protecting-your-database.md). A gate admits an operation in two steps:
 *
 * <ol>
 *   <li>{@link #verifyForLock}: the token is present, genuine (verified offline, keys from
 *       {@code GET /v1/keys}) and names the lock guarding the data; a refusal here has
 *       touched nothing (S12);
 *   <li>inside the caller's transaction the backend reads the lock's mark, applies {@link
 *       #decide}, and stores the new mark, so that the mark and the caller's writes commit
 *       together or not at all (S6). {@link PostgresGate} does it over JDBC.
 * </ol>
 *
 * <p>Refusals are the client's {@link PalisadeException}s with the server's codes: {@code
 * missing_token}, {@code invalid_token} (its cause the verifier's {@link TokenException}),
 * {@link PalisadeException.WrongLock}, {@link PalisadeException.StaleToken}, {@link
 * PalisadeException.StaleSequence}, {@code write_conflict} (a lost race: retry the whole
 * transaction) and {@code storage_failed} (the database failed, or holds a mark no gate
 * wrote).
 *
 * <p>What a gate does not guarantee: it does not deduplicate retries (S9; use the
 * sequence policy), it does not cancel in-flight work (S10), it protects only the writes
 * that go through it (S2), it is as durable as the database (S11), and it is not access
 * control (S14).
 */
public final class Gate {
  private Gate() {}

  /**
   * Checks that {@code token} is present, genuine and names {@code lock}; touches no
   * resource. A token that is null or blank (trimmed as Rust's {@code str::trim} does) is
   * {@code missing_token}.
   */
  public static Claims verifyForLock(Verifier verifier, String token, String lock) throws PalisadeException {
    String trimmed = token == null ? "" : trim(token);
    if (trimmed.isEmpty()) {
      throw PalisadeException.of(400, "missing_token", "this operation needs a fencing token", Map.of());
    }
    Claims claims;
    try {
      claims = verifier.verify(trimmed);
    } catch (TokenException refused) {
      PalisadeException e = PalisadeException.of(400, "invalid_token", refused.getMessage(), Map.of());
      e.initCause(refused);
      throw e;
    }
    if (!claims.lock().equals(lock)) {
      throw PalisadeException.of(
          403,
          "wrong_lock",
          "token is for lock \"" + claims.lock() + "\", not \"" + lock + "\"",
          Map.of("token_lock", claims.lock()));
    }
    return claims;
  }

  /**
   * The gate rule of palisade-core: the new mark to store, or the refusal. It refuses
   * {@code epoch < current.epoch} ({@link PalisadeException.StaleToken}); under the epoch
   * policy it admits and raises the mark to (epoch, 0); under the sequence policy (epoch,
   * seq) must also strictly exceed the mark ({@link PalisadeException.StaleSequence}). An
   * epoch or sequence past the SQL integer range ({@code epoch} and {@code seq} are
   * unsigned) is {@code storage_failed}, never wrapped. Correct only when the caller reads
   * {@code current} and stores the result in one transaction with the write.
   */
  public static HighWater decide(HighWater current, Policy policy, long epoch, long seq) throws PalisadeException {
    if (Long.compareUnsigned(epoch, current.epoch()) < 0) {
      throw PalisadeException.of(
          409,
          "stale_token",
          "epoch " + Long.toUnsignedString(epoch) + " is older than the high-water mark " + current.epoch(),
          Map.of("high_water", current.epoch(), "epoch", epoch));
    }
    HighWater next = new HighWater(epoch, 0);
    if (policy == Policy.SEQUENCE) {
      if (epoch == current.epoch() && Long.compareUnsigned(seq, current.seq()) <= 0) {
        throw PalisadeException.of(
            409,
            "stale_sequence",
            "sequence " + Long.toUnsignedString(seq) + " is not above " + current.seq() + " within epoch " + epoch,
            Map.of("high_water", current.epoch(), "high_water_seq", current.seq(), "epoch", epoch, "seq", seq));
      }
      next = new HighWater(epoch, seq);
    }
    if (next.epoch() < 0 || next.seq() < 0) {
      throw storageFailed(
          "mark (" + Long.toUnsignedString(next.epoch()) + ", " + Long.toUnsignedString(next.seq())
              + ") exceeds the SQL integer range",
          null);
    }
    return next;
  }

  /** A stored mark read back: a negative one was edited by hand; the gate refuses to guess. */
  public static HighWater fromSql(long epoch, long seq) throws PalisadeException {
    if (epoch < 0 || seq < 0) {
      throw storageFailed("unreadable fence record: mark (" + epoch + ", " + seq + ")", null);
    }
    return new HighWater(epoch, seq);
  }

  /**
   * The characters with Unicode's White_Space property, which Rust's {@code str::trim}
   * removes. Java's {@code String.strip} differs (it keeps U+00A0, U+2007 and U+202F and
   * removes U+001C..U+001F): a token padded with one of those would pass here and fail in
   * the Rust gate, or the other way round.
   */
  private static final String WHITE_SPACE =
      "\t\n\u000b\f\r\u0020\u0085\u00a0\u1680"
          + "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
          + "\u2028\u2029\u202f\u205f\u3000";

  /** {@code text} without leading and trailing White_Space, as Rust's {@code str::trim}. */
  static String trim(String text) {
    int start = 0;
    int end = text.length();
    while (start < end && WHITE_SPACE.indexOf(text.charAt(start)) >= 0) {
      start++;
    }
    while (end > start && WHITE_SPACE.indexOf(text.charAt(end - 1)) >= 0) {
      end--;
    }
    return text.substring(start, end);
  }

  /** {@code write_conflict}: a lost race with {@code cause}; retry the transaction. */
  public static PalisadeException conflict(Throwable cause) {
    PalisadeException e =
        PalisadeException.of(409, "write_conflict", "concurrent update of the fenced resource; retry", Map.of());
    e.initCause(cause);
    return e;
  }

  /** {@code storage_failed}, with its cause when there is one. */
  public static PalisadeException storageFailed(String message, Throwable cause) {
    PalisadeException e = PalisadeException.of(503, "storage_failed", message, Map.of());
    if (cause != null) {
      e.initCause(cause);
    }
    return e;
  }
}
