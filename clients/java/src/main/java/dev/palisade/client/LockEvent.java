// The server's live events, typed: one record per event type of docs/api.md.
package dev.palisade.client;

/**
 * One event of the server's stream ({@code GET /v1/events}, {@code GET
 * /v1/locks/{lock}/events}): every type of docs/api.md, with its fields. Ids increase;
 * {@code atMs} is the server's wall clock in milliseconds since the Unix epoch. A type this
 * version does not know is skipped by the stream, as the API asks.
 */
public sealed interface LockEvent
    permits LockEvent.Granted,
        LockEvent.Released,
        LockEvent.Expired,
        LockEvent.MarkAdvanced,
        LockEvent.Rejected,
        LockEvent.Reset {
  /** The event's id. */
  long id();

  /** When the server saw it, in ms since the Unix epoch. */
  long atMs();

  /** {@code holder} was granted {@code lock} with {@code epoch} for {@code ttlMs}. */
  record Granted(long id, long atMs, String lock, long epoch, String holder, long ttlMs) implements LockEvent {}

  /** The lease of {@code epoch} ended by release ({@code cause} {@code release}, or {@code unknown}). */
  record Released(long id, long atMs, String lock, long epoch, String holder, String cause) implements LockEvent {}

  /** The lease of {@code epoch} ran out without renewal. */
  record Expired(long id, long atMs, String lock, long epoch, String holder) implements LockEvent {}

  /** The namespace's high-water mark advanced to ({@code highWater}, {@code seq}). */
  record MarkAdvanced(long id, long atMs, String lock, long highWater, long seq) implements LockEvent {}

  /**
   * A mutation of the namespace was refused with {@code code}; {@code epoch} is the token's
   * (null when none verified), {@code highWater} the mark that refused it (null unless the
   * refusal is stale_token or stale_sequence).
   */
  record Rejected(long id, long atMs, String lock, String code, Long epoch, Long highWater) implements LockEvent {}

  /**
   * Events may be missing ({@code reason}: {@code unknown_last_event_id}, {@code lagged}
   * or {@code gap}): read the state again and go on from there.
   */
  record Reset(long id, long atMs, String reason) implements LockEvent {}
}
