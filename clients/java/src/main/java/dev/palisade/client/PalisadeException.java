// The typed errors: every error answer the server sends, decoded by its stable code.
package dev.palisade.client;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * An error answer of the server: its stable {@link #code()} (docs/api.md, "Error codes"),
 * its HTTP {@link #status()} and a message for humans. The codes with fields to act on
 * are subclasses carrying them ({@link StaleToken}, {@link LockHeld}, ...); every other
 * code, a code this version does not know, and a known code whose fields are missing or
 * of another type is a plain {@code PalisadeException}: no field is ever invented.
 *
 * <p>It is an {@link IOException}, like every other way a call can fail: for a mutation,
 * an {@code IOException} that is not a {@code PalisadeException} means the outcome is
 * unknown.
 */
public class PalisadeException extends IOException {
  private static final long serialVersionUID = 1L;
  private static final ObjectMapper JSON = new ObjectMapper();

  private final int status;
  private final String code;

  PalisadeException(int status, String code, String message) {
    super(code + " (HTTP " + status + "): " + message);
    this.status = status;
    this.code = code;
  }

  private PalisadeException(Base base) {
    this(base.status, base.code, base.message);
  }

  /** The stable error code: {@code stale_token}, {@code lock_held}, ... */
  public String code() {
    return code;
  }

  /** The HTTP status of the answer. */
  public int status() {
    return status;
  }

  /** Whether this says the holder's epoch is fenced off (stale_token or stale_sequence). */
  public boolean isFenced() {
    return this instanceof StaleToken || this instanceof StaleSequence;
  }

  /** The answer's typed fields by their wire names (none for a plain error). */
  public Map<String, Object> fields() {
    return Map.of();
  }

  /**
   * The typed error of a non-success answer, or an {@link UnreadableAnswerException} when
   * the body is not a Palisade error at all (a proxy's page, an empty 404 from a wrong base
   * URL): never a guessed code.
   */
  public static IOException parse(int status, byte[] body) {
    JsonNode error;
    try {
      JsonNode root = JSON.readTree(body);
      error = root == null ? null : root.get("error");
    } catch (IOException e) {
      error = null;
    }
    if (error == null || !error.isObject() || !error.path("code").isTextual()) {
      return new UnreadableAnswerException(status, new String(body, StandardCharsets.UTF_8));
    }
    return typed(new Base(status, error.get("code").textValue(), error.path("message").asText("")), error);
  }

  /**
   * The typed error for {@code code} with {@code fields} (by their wire names), as if the
   * server had answered it: how a gate, deciding in the caller's own process, raises the
   * same exceptions the server's answers decode to.
   */
  public static PalisadeException of(int status, String code, String message, Map<String, ?> fields) {
    return typed(new Base(status, code, message), JSON.valueToTree(fields));
  }

  private static PalisadeException typed(Base base, JsonNode error) {
    Fields f = new Fields(error);
    PalisadeException typed =
        switch (base.code) {
          case "stale_token" -> new StaleToken(base, f.u64("high_water"), f.u64("epoch"));
          case "stale_sequence" -> new StaleSequence(
              base, f.u64("high_water"), f.u64("high_water_seq"), f.u64("epoch"), f.u64("seq"));
          case "lock_held" -> new LockHeld(base, f.optString("holder"), f.u64("retry_after_ms"));
          case "revision_mismatch" -> new RevisionMismatch(base, f.optU64("current_revision"));
          case "wrong_lock" -> new WrongLock(base, f.string("token_lock"));
          case "quota_exceeded" -> new QuotaExceeded(base, f.string("resource"), f.u64("limit"));
          case "payload_too_large" -> new PayloadTooLarge(base, f.optU64("limit"));
          case "permission_denied" -> new PermissionDenied(base, f.optString("principal"));
          case "not_found" -> new NotFound(base, f.optString("key_id"));
          case "key_active" -> new KeyActive(base, f.string("key_id"));
          case "lease_expired" -> new LeaseLost(base);
          default -> null;
        };
    return typed != null && f.ok ? typed : new PalisadeException(base);
  }

  private record Base(int status, String code, String message) {}

  /** Reads fields strictly: one of another type marks the answer as not typed. */
  private static final class Fields {
    private final JsonNode error;
    boolean ok = true;

    Fields(JsonNode error) {
      this.error = error;
    }

    long u64(String name) {
      JsonNode v = error.get(name);
      if (v == null || !v.isIntegralNumber() || v.bigIntegerValue().signum() < 0 || v.bigIntegerValue().bitLength() > 64) {
        ok = false;
        return 0;
      }
      return v.bigIntegerValue().longValue();
    }

    String string(String name) {
      JsonNode v = error.get(name);
      if (v == null || !v.isTextual()) {
        ok = false;
        return "";
      }
      return v.textValue();
    }

    Long optU64(String name) {
      JsonNode v = error.get(name);
      return v == null || v.isNull() ? null : u64(name);
    }

    String optString(String name) {
      JsonNode v = error.get(name);
      return v == null || v.isNull() ? null : string(name);
    }
  }

  private static Map<String, Object> named(Object... nameValue) {
    Map<String, Object> map = new LinkedHashMap<>();
    for (int i = 0; i < nameValue.length; i += 2) {
      map.put((String) nameValue[i], nameValue[i + 1]);
    }
    return map;
  }

  /**
   * lease_expired: the lease is gone (it expired, or was released), or the client saw no
   * successful renewal within the lease's TTL (then {@link #status()} is 0 and the cause is
   * the last failure). Another holder may have the lock; a new lease would be a new epoch.
   */
  public static final class LeaseLost extends PalisadeException {
    private static final long serialVersionUID = 1L;

    private LeaseLost(Base base) {
      super(base);
    }

    /**
     * The loss the client decides on its own: no renewal worked before the renewal deadline
     * ({@link Deadlines}).
     */
    static LeaseLost presumed(String what, IOException lastFailure) {
      LeaseLost lost = new LeaseLost(new Base(0, "lease_expired", "no renewal of " + what + " worked before its renewal deadline"));
      lost.initCause(lastFailure);
      return lost;
    }
  }

  /** stale_token: a newer epoch reached the resource first; this holder is fenced off. */
  public static final class StaleToken extends PalisadeException {
    private static final long serialVersionUID = 1L;
    private final long highWater;
    private final long epoch;

    private StaleToken(Base base, long highWater, long epoch) {
      super(base);
      this.highWater = highWater;
      this.epoch = epoch;
    }

    /** The newest epoch the resource has seen. */
    public long highWater() {
      return highWater;
    }

    /** The epoch that was refused. */
    public long epoch() {
      return epoch;
    }

    @Override
    public Map<String, Object> fields() {
      return named("high_water", highWater, "epoch", epoch);
    }
  }

  /** stale_sequence: within the epoch, a sequence number at or below the last admitted. */
  public static final class StaleSequence extends PalisadeException {
    private static final long serialVersionUID = 1L;
    private final long highWater;
    private final long highWaterSeq;
    private final long epoch;
    private final long seq;

    private StaleSequence(Base base, long highWater, long highWaterSeq, long epoch, long seq) {
      super(base);
      this.highWater = highWater;
      this.highWaterSeq = highWaterSeq;
      this.epoch = epoch;
      this.seq = seq;
    }

    public long highWater() {
      return highWater;
    }

    public long highWaterSeq() {
      return highWaterSeq;
    }

    public long epoch() {
      return epoch;
    }

    public long seq() {
      return seq;
    }

    @Override
    public Map<String, Object> fields() {
      return named("high_water", highWater, "high_water_seq", highWaterSeq, "epoch", epoch, "seq", seq);
    }
  }

  /**
   * lock_held. {@link #holder()} is null while the lock sits in its lock-delay, or when the
   * caller may not see holders.
   */
  public static final class LockHeld extends PalisadeException {
    private static final long serialVersionUID = 1L;
    private final String holder;
    private final long retryAfterMs;

    private LockHeld(Base base, String holder, long retryAfterMs) {
      super(base);
      this.holder = holder;
      this.retryAfterMs = retryAfterMs;
    }

    public String holder() {
      return holder;
    }

    /** When the lock may be free at the earliest, in milliseconds from the answer. */
    public long retryAfterMs() {
      return retryAfterMs;
    }

    @Override
    public Map<String, Object> fields() {
      return named("holder", holder, "retry_after_ms", retryAfterMs);
    }
  }

  /**
   * revision_mismatch: an If-Match or If-None-Match precondition failed. The current
   * revision is null when the key does not exist.
   */
  public static final class RevisionMismatch extends PalisadeException {
    private static final long serialVersionUID = 1L;
    private final Long currentRevision;

    private RevisionMismatch(Base base, Long currentRevision) {
      super(base);
      this.currentRevision = currentRevision;
    }

    public Long currentRevision() {
      return currentRevision;
    }

    @Override
    public Map<String, Object> fields() {
      return named("current_revision", currentRevision);
    }
  }

  /** wrong_lock: the token is genuine, but for another lock. */
  public static final class WrongLock extends PalisadeException {
    private static final long serialVersionUID = 1L;
    private final String tokenLock;

    private WrongLock(Base base, String tokenLock) {
      super(base);
      this.tokenLock = tokenLock;
    }

    public String tokenLock() {
      return tokenLock;
    }

    @Override
    public Map<String, Object> fields() {
      return named("token_lock", tokenLock);
    }
  }

  /** quota_exceeded: {@link #resource()} is limited to {@link #limit()}; nothing changed. */
  public static final class QuotaExceeded extends PalisadeException {
    private static final long serialVersionUID = 1L;
    private final String resource;
    private final long limit;

    private QuotaExceeded(Base base, String resource, long limit) {
      super(base);
      this.resource = resource;
      this.limit = limit;
    }

    /** The limited resource, as docs/api.md names it: {@code locks}, {@code sessions}, ... */
    public String resource() {
      return resource;
    }

    public long limit() {
      return limit;
    }

    @Override
    public Map<String, Object> fields() {
      return named("resource", resource, "limit", limit);
    }
  }

  /** payload_too_large; the limit is null when the connection's own limit refused it. */
  public static final class PayloadTooLarge extends PalisadeException {
    private static final long serialVersionUID = 1L;
    private final Long limit;

    private PayloadTooLarge(Base base, Long limit) {
      super(base);
      this.limit = limit;
    }

    public Long limit() {
      return limit;
    }

    @Override
    public Map<String, Object> fields() {
      return named("limit", limit);
    }
  }

  /** permission_denied; the principal refused, when the caller named one. */
  public static final class PermissionDenied extends PalisadeException {
    private static final long serialVersionUID = 1L;
    private final String principal;

    private PermissionDenied(Base base, String principal) {
      super(base);
      this.principal = principal;
    }

    public String principal() {
      return principal;
    }

    @Override
    public Map<String, Object> fields() {
      return named("principal", principal);
    }
  }

  /** not_found; the key id an admin key route did not find, when it was one. */
  public static final class NotFound extends PalisadeException {
    private static final long serialVersionUID = 1L;
    private final String keyId;

    private NotFound(Base base, String keyId) {
      super(base);
      this.keyId = keyId;
    }

    public String keyId() {
      return keyId;
    }

    @Override
    public Map<String, Object> fields() {
      return named("key_id", keyId);
    }
  }

  /** key_active: the key still signs and cannot be retired. */
  public static final class KeyActive extends PalisadeException {
    private static final long serialVersionUID = 1L;
    private final String keyId;

    private KeyActive(Base base, String keyId) {
      super(base);
      this.keyId = keyId;
    }

    public String keyId() {
      return keyId;
    }

    @Override
    public Map<String, Object> fields() {
      return named("key_id", keyId);
    }
  }
}
