// The optional headers of a fenced mutation.
package dev.palisade.client;

/**
 * The optional headers of a fenced mutation (docs/api.md, "The fenced store"), immutable:
 * {@code PutOptions.none().ifMatch(7).idempotencyKey("order-42")}.
 */
public final class PutOptions {
  final Long ifMatch;
  final boolean ifNoneMatch;
  final String idempotencyKey;
  final Long seq;

  private PutOptions(Long ifMatch, boolean ifNoneMatch, String idempotencyKey, Long seq) {
    this.ifMatch = ifMatch;
    this.ifNoneMatch = ifNoneMatch;
    this.idempotencyKey = idempotencyKey;
    this.seq = seq;
  }

  /** No option: a plain fenced mutation. */
  public static PutOptions none() {
    return new PutOptions(null, false, null, null);
  }

  /**
   * Only if the key's current revision is {@code revision} ({@code If-Match}); else {@link
   * PalisadeException.RevisionMismatch}.
   */
  public PutOptions ifMatch(long revision) {
    return new PutOptions(revision, false, idempotencyKey, seq);
  }

  /** Only if the key does not exist ({@code If-None-Match: *}). */
  public PutOptions ifAbsent() {
    return new PutOptions(null, true, idempotencyKey, seq);
  }

  /**
   * A retry with the same key returns the first outcome without applying twice ({@code
   * Idempotency-Key}: 1 to 128 visible ASCII characters).
   */
  public PutOptions idempotencyKey(String key) {
    return new PutOptions(ifMatch, ifNoneMatch, key, seq);
  }

  /**
   * The operation's sequence number ({@code Fencing-Seq}), required in namespaces whose
   * policy is {@code sequence}: (epoch, seq) must strictly increase (unsigned).
   */
  public PutOptions seq(long seq) {
    return new PutOptions(ifMatch, ifNoneMatch, idempotencyKey, seq);
  }
}
