// The HTTP client of a Palisade deployment: locks, leases, the fenced store, the barrier,
// token checks, values, sessions and keys, over one endpoint or several.
package dev.palisade.client;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import dev.palisade.client.Transport.Call;
import dev.palisade.client.Transport.Retry;
import dev.palisade.token.KeyRing;
import java.io.IOException;
import java.io.InputStream;
import java.net.http.HttpClient;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyStore;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.UUID;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

/**
 * Speaks the HTTP API of a Palisade deployment (docs/api.md) with the JDK's {@link
 * HttpClient}. Safe for concurrent use. Every error the server answers is a typed {@link
 * PalisadeException}; any other {@link IOException} of a mutation means its outcome is
 * unknown.
 *
 * <p>Given several endpoints (the nodes of one deployment over etcd), a call moves to the
 * next node when its node cannot be reached or answers 503, unless resending could apply
 * it twice: an acquire whose answer was lost is not resent, and every fenced write carries
 * an {@code Idempotency-Key} (a fresh one when the caller gave none), so a resend of it is
 * answered with the first outcome instead of being applied again.
 */
public final class PalisadeClient {
  private static final ObjectMapper JSON = new ObjectMapper();

  private final Transport transport;
  private final Duration timeout;
  private final Deadlines deadlines;

  private PalisadeClient(Builder b) {
    HttpClient http = b.http;
    if (http == null) {
      HttpClient.Builder hb = HttpClient.newBuilder().connectTimeout(b.timeout);
      if (b.ssl != null) {
        hb.sslContext(b.ssl);
      }
      http = hb.build();
    }
    List<String> bases = new ArrayList<>();
    for (String url : b.urls) {
      bases.add(url.replaceAll("/+$", ""));
    }
    this.transport = new Transport(bases, http, b.key);
    this.timeout = b.timeout;
    this.deadlines = b.deadlines;
  }

  /** How this client's guards derive their deadlines from the TTL. */
  public Deadlines deadlines() {
    return deadlines;
  }

  /** A client of the server at {@code baseUrl} ({@code http://127.0.0.1:7070}, say). */
  public static Builder builder(String baseUrl) {
    return new Builder(baseUrl);
  }

  /** Sets up a {@link PalisadeClient}. */
  public static final class Builder {
    private final List<String> urls = new ArrayList<>();
    private HttpClient http;
    private SSLContext ssl;
    private String key;
    private Duration timeout = Duration.ofSeconds(30);
    private Deadlines deadlines = Deadlines.DEFAULT;

    private Builder(String baseUrl) {
      urls.add(Objects.requireNonNull(baseUrl, "baseUrl"));
    }

    /** Another node of the same deployment, tried in order when one fails (failover). */
    public Builder endpoint(String url) {
      urls.add(Objects.requireNonNull(url, "url"));
      return this;
    }

    /** Sends {@code key} as the bearer key of every request (a server with authentication). */
    public Builder bearerKey(String key) {
      this.key = key;
      return this;
    }

    /**
     * Trusts the CA certificates in this PEM file (and only them) for {@code https://}
     * endpoints: a deployment with its own CA. For client certificates, a proxy or other
     * settings, give your own {@link #httpClient}.
     */
    public Builder caCertificate(Path pem) throws IOException {
      try (InputStream in = Files.newInputStream(pem)) {
        KeyStore store = KeyStore.getInstance(KeyStore.getDefaultType());
        store.load(null, null);
        int n = 0;
        for (Certificate cert : CertificateFactory.getInstance("X.509").generateCertificates(in)) {
          store.setCertificateEntry("ca-" + n++, cert);
        }
        if (n == 0) {
          throw new IOException("no certificate in " + pem);
        }
        TrustManagerFactory trust = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
        trust.init(store);
        SSLContext context = SSLContext.getInstance("TLS");
        context.init(null, trust.getTrustManagers(), null);
        this.ssl = context;
        return this;
      } catch (GeneralSecurityException e) {
        throw new IOException("cannot trust " + pem + ": " + e.getMessage(), e);
      }
    }

    /** Uses {@code http} for every request (client certificates, a proxy). */
    public Builder httpClient(HttpClient http) {
      this.http = http;
      return this;
    }

    /** How long a request may take, beyond any wait in line it asks for (default 30 s). */
    public Builder timeout(Duration timeout) {
      this.timeout = Objects.requireNonNull(timeout, "timeout");
      return this;
    }

    /**
     * How this client's guards derive their safe deadline and renewal deadline from the TTL
     * (default {@link Deadlines#DEFAULT}: 2/3 of the TTL, 1 % clock drift).
     */
    public Builder deadlines(Deadlines deadlines) {
      this.deadlines = Objects.requireNonNull(deadlines, "deadlines");
      return this;
    }

    public PalisadeClient build() {
      return new PalisadeClient(this);
    }
  }

  // ---- locks and leases ----------------------------------------------------------------

  /** Takes {@code lock} ({@code POST /v1/locks/{lock}/acquire}). */
  public Lease acquire(String lock, AcquireOptions options) throws IOException, InterruptedException {
    ObjectNode body = JSON.createObjectNode();
    if (options.ttl != null) {
      body.put("ttl_ms", options.ttl.toMillis());
    }
    if (options.session != null) {
      body.put("session", options.session);
    }
    if (options.holder != null) {
      body.put("holder", options.holder);
    }
    if (!options.wait.isZero()) {
      body.put("wait_ms", options.wait.toMillis());
    }
    if (options.lockDelay != null) {
      body.put("lock_delay_ms", options.lockDelay.toMillis());
    }
    if (options.value != null) {
      body.put("value", Base64.getEncoder().encodeToString(options.value));
    }
    String path = "/v1/locks/" + name("lock name", lock) + "/acquire";
    JsonNode answer = call(json("POST", path, body, timeout.plus(options.wait), Retry.UNLESS_UNKNOWN));
    Answer a = new Answer(answer, 200);
    return new Lease(
        a.string("lock"),
        a.string("holder"),
        a.u64("epoch"),
        a.string("token"),
        a.string("lease_id"),
        a.u64("ttl_ms"),
        answer.has("lock_delay_ms") ? a.u64("lock_delay_ms") : 0);
  }

  /** Renews a lease for a full TTL from now; {@code lease_expired} when it is gone. */
  public void keepAlive(String leaseId) throws IOException, InterruptedException {
    keepAlive(leaseId, timeout);
  }

  void keepAlive(String leaseId, Duration requestTimeout) throws IOException, InterruptedException {
    call(empty("POST", "/v1/leases/" + name("lease id", leaseId) + "/keepalive", requestTimeout));
  }

  /** Gives a lease up; the lock passes to the next in line. */
  public void release(String leaseId) throws IOException, InterruptedException {
    call(empty("POST", "/v1/leases/" + name("lease id", leaseId) + "/release", timeout));
  }

  /**
   * Acquires {@code lock} and renews it in the background until the guard is closed or the
   * lease is lost: use it in try-with-resources.
   */
  public LeaseGuard hold(String lock, AcquireOptions options) throws IOException, InterruptedException {
    long sentAt = System.nanoTime(); // the lease runs from a moment after this
    return guard(acquire(lock, options), sentAt);
  }

  /**
   * The guard of a lease whose acquisition was sent at {@code sentAt}. After a wait in line
   * the grant may have come long after the send, and deadlines counted from the send may be
   * (nearly) over already: the lease is renewed once first, so they count from that renewal.
   */
  LeaseGuard guard(Lease lease, long sentAt) throws IOException, InterruptedException {
    if (System.nanoTime() - sentAt > lease.ttlMs() * 1_000_000 / 3) {
      sentAt = System.nanoTime();
      keepAlive(lease.leaseId());
    }
    return new LeaseGuard(this, lease, sentAt);
  }

  /** {@code lock}'s status: its epoch, holder, value and waiters. */
  public LockStatus status(String lock) throws IOException, InterruptedException {
    Answer a = new Answer(call(empty("GET", "/v1/locks/" + name("lock name", lock), timeout)), 200);
    String value = a.optString("value");
    return new LockStatus(
        a.string("lock"), a.u64("epoch"), a.optString("holder"), a.optString("lease_id"), a.optU64("remaining_ms"),
        a.u64("waiters"), value == null ? null : decodeValue(value), a.optU64("lock_delay_ms"), a.optString("session"));
  }

  /** Replaces what the lease's holder advertises ({@code null} clears it); epoch and deadline unchanged. */
  public void proclaim(String leaseId, byte[] value) throws IOException, InterruptedException {
    ObjectNode body = JSON.createObjectNode();
    if (value == null) {
      body.putNull("value");
    } else {
      body.put("value", Base64.getEncoder().encodeToString(value));
    }
    call(json("POST", "/v1/leases/" + name("lease id", leaseId) + "/proclaim", body, timeout, Retry.SAFE));
  }

  // ---- sessions -----------------------------------------------------------------------

  /** Opens a session: one keepalive for many locks ({@link AcquireOptions#inSession}). */
  public Session createSession(String holder, Duration ttl) throws IOException, InterruptedException {
    ObjectNode body = JSON.createObjectNode().put("ttl_ms", ttl.toMillis());
    if (holder != null) {
      body.put("holder", holder);
    }
    return session(call(json("POST", "/v1/sessions", body, timeout, Retry.UNLESS_UNKNOWN)));
  }

  /** A session as it is now; {@code session_expired} once it ended. */
  public Session getSession(String sessionId) throws IOException, InterruptedException {
    return session(call(empty("GET", "/v1/sessions/" + name("session id", sessionId), timeout)));
  }

  /** Renews a session and every lease in it for a full TTL from now. */
  public Session keepAliveSession(String sessionId) throws IOException, InterruptedException {
    return keepAliveSession(sessionId, timeout);
  }

  Session keepAliveSession(String sessionId, Duration requestTimeout) throws IOException, InterruptedException {
    return session(call(empty("POST", "/v1/sessions/" + name("session id", sessionId) + "/keepalive", requestTimeout)));
  }

  /** Closes a session: every lease in it is released at once, without lock-delay. */
  public Session closeSession(String sessionId) throws IOException, InterruptedException {
    return session(call(empty("POST", "/v1/sessions/" + name("session id", sessionId) + "/close", timeout)));
  }

  /**
   * Opens a session and renews it in the background until the guard is closed (which
   * closes the session) or the session is lost.
   */
  public SessionGuard holdSession(String holder, Duration ttl) throws IOException, InterruptedException {
    long sentAt = System.nanoTime();
    return new SessionGuard(this, createSession(holder, ttl), sentAt);
  }

  // ---- the fenced store and the barrier -----------------------------------------------

  /**
   * Writes {@code value} under {@code key} in {@code lock}'s namespace, fenced by {@code
   * token}: refused with {@link PalisadeException.StaleToken} once a newer epoch wrote there.
   */
  public Written put(String lock, String key, byte[] value, String token)
      throws IOException, InterruptedException {
    return put(lock, key, value, token, PutOptions.none());
  }

  /** {@link #put(String, String, byte[], String)} with preconditions, an idempotency key or a sequence number. */
  public Written put(String lock, String key, byte[] value, String token, PutOptions options)
      throws IOException, InterruptedException {
    Answer a = new Answer(call(fenced("PUT", kvPath(lock, key), value, token, options)), 200);
    return new Written(a.u64("revision"), a.u64("epoch"));
  }

  /** Reads {@code key} in {@code lock}'s namespace; {@link PalisadeException.NotFound} if absent. */
  public Entry get(String lock, String key) throws IOException, InterruptedException {
    HttpResponse<byte[]> response = transport.send(empty("GET", kvPath(lock, key), timeout));
    if (response.statusCode() != 200) {
      throw PalisadeException.parse(response.statusCode(), response.body());
    }
    String etag = response.headers().firstValue("ETag").orElse("").replace("\"", "");
    String epoch = response.headers().firstValue("Fencing-Epoch").orElse("");
    try {
      return new Entry(response.body(), Long.parseUnsignedLong(etag), Long.parseUnsignedLong(epoch));
    } catch (NumberFormatException e) {
      throw new UnreadableAnswerException(200, "no ETag or Fencing-Epoch header");
    }
  }

  /** Deletes {@code key}, fenced like a put; {@link PalisadeException.NotFound} if absent. */
  public Written delete(String lock, String key, String token, PutOptions options)
      throws IOException, InterruptedException {
    Answer a = new Answer(call(fenced("DELETE", kvPath(lock, key), null, token, options)), 200);
    return new Written(a.u64("revision"), a.u64("epoch"));
  }

  /** The keys of {@code lock}'s namespace that start with {@code prefix}, in order, at most {@code limit}. */
  public List<String> list(String lock, String prefix, int limit) throws IOException, InterruptedException {
    String path = "/v1/kv/" + name("lock name", lock) + "?prefix=" + query(prefix) + "&limit=" + limit;
    JsonNode answer = call(empty("GET", path, timeout));
    List<String> keys = new ArrayList<>();
    JsonNode listed = answer.get("keys");
    if (listed == null || !listed.isArray()) {
      throw new UnreadableAnswerException(200, "no keys in " + answer);
    }
    for (JsonNode key : listed) {
      if (!key.isTextual()) {
        throw new UnreadableAnswerException(200, "a key that is not text in " + answer);
      }
      keys.add(key.textValue());
    }
    return keys;
  }

  /**
   * The barrier: advances {@code lock}'s high-water mark to the token's epoch without
   * writing data, so that every older holder's later write is refused from now on.
   */
  public Fenced fence(String lock, String token, PutOptions options) throws IOException, InterruptedException {
    Answer a = new Answer(call(fenced("POST", "/v1/fences/" + name("lock name", lock), null, token, options)), 200);
    return new Fenced(a.string("lock"), a.u64("high_water"), a.u64("epoch"));
  }

  /** {@code lock}'s namespace mark ({@code GET /v1/fences/{lock}}). */
  public FenceStatus fenceStatus(String lock) throws IOException, InterruptedException {
    Answer a = new Answer(call(empty("GET", "/v1/fences/" + name("lock name", lock), timeout)), 200);
    return new FenceStatus(a.string("lock"), a.u64("high_water"), a.u64("seq"), a.string("policy"));
  }

  // ---- events -------------------------------------------------------------------------

  /** The live events of every lock whose name starts with {@code prefix} ("" for all). */
  public EventStream events(String prefix) {
    String path = prefix.isEmpty() ? "/v1/events" : "/v1/events?prefix=" + query(prefix);
    return new EventStream(transport, path, timeout);
  }

  /** The live events of one lock. */
  public EventStream lockEvents(String lock) {
    return new EventStream(transport, "/v1/locks/" + name("lock name", lock) + "/events", timeout);
  }

  // ---- tokens -------------------------------------------------------------------------

  /** What the server says of {@code token} now: a snapshot, never a fence. */
  public TokenCheck checkToken(String token) throws IOException, InterruptedException {
    ObjectNode body = JSON.createObjectNode().put("token", token);
    Answer a = new Answer(call(json("POST", "/v1/tokens/check", body, timeout, Retry.SAFE)), 200);
    if (!a.bool("genuine")) {
      return new TokenCheck(false, a.optString("reason"), null, 0, null, null, 0, false, false);
    }
    return new TokenCheck(
        true, null, a.string("lock"), a.u64("epoch"), a.string("holder"), a.string("key_id"),
        a.u64("current_epoch"), a.bool("current"), a.bool("lease_alive"));
  }

  /**
   * The keys a resource should trust now ({@code GET /v1/keys}), as a ring for the offline
   * {@link dev.palisade.token.Verifier}: active and verifying keys, retired ones left out.
   */
  public KeyRing keys() throws IOException, InterruptedException {
    JsonNode answer = call(empty("GET", "/v1/keys", timeout));
    List<KeyRing.Listed> listed = new ArrayList<>();
    for (JsonNode key : answer.path("keys")) {
      listed.add(
          new KeyRing.Listed(
              key.path("key_id").asText(),
              key.path("alg").asText(),
              key.path("public_key").asText(),
              key.hasNonNull("status") ? key.get("status").asText() : null));
    }
    try {
      return KeyRing.fromListing(listed);
    } catch (IllegalArgumentException e) {
      throw new UnreadableAnswerException(200, e.getMessage());
    }
  }

  // ---- the calls ----------------------------------------------------------------------

  /** A call without a body; GETs and the lease and session routes are safe to resend. */
  private static Call empty(String method, String path, Duration timeout) {
    return new Call(method, path, null, Map.of(), timeout, Retry.SAFE);
  }

  private static Call json(String method, String path, JsonNode body, Duration timeout, Retry retry)
      throws IOException {
    return new Call(method, path, JSON.writeValueAsBytes(body), Map.of("Content-Type", "application/json"), timeout, retry);
  }

  /**
   * A fenced mutation with its headers. With several endpoints it always carries an
   * idempotency key (a fresh one when the caller gave none), which makes it safe to resend.
   */
  private Call fenced(String method, String path, byte[] body, String token, PutOptions options) {
    Map<String, String> headers = new HashMap<>();
    headers.put("Fencing-Token", token);
    if (body != null) {
      headers.put("Content-Type", "application/octet-stream");
    }
    if (options.ifMatch != null) {
      headers.put("If-Match", "\"" + Long.toUnsignedString(options.ifMatch) + "\"");
    }
    if (options.ifNoneMatch) {
      headers.put("If-None-Match", "*");
    }
    if (options.seq != null) {
      headers.put("Fencing-Seq", Long.toUnsignedString(options.seq));
    }
    String key = options.idempotencyKey;
    if (key == null && transport.failsOver()) {
      key = UUID.randomUUID().toString();
    }
    if (key != null) {
      headers.put("Idempotency-Key", key);
    }
    return new Call(method, path, body == null ? new byte[0] : body, headers, timeout, key != null ? Retry.SAFE : Retry.ONLY_UNREACHABLE);
  }

  /** Sends a call and reads a 200's JSON body (an empty object when empty); a refusal throws. */
  private JsonNode call(Call call) throws IOException, InterruptedException {
    HttpResponse<byte[]> response = transport.send(call);
    if (response.statusCode() != 200) {
      throw PalisadeException.parse(response.statusCode(), response.body());
    }
    if (response.body().length == 0) {
      return JSON.createObjectNode();
    }
    try {
      return JSON.readTree(response.body());
    } catch (IOException e) {
      throw new UnreadableAnswerException(200, new String(response.body(), StandardCharsets.UTF_8));
    }
  }

  private static Session session(JsonNode answer) throws UnreadableAnswerException {
    Answer a = new Answer(answer, 200);
    List<Session.Member> members = new ArrayList<>();
    JsonNode leases = answer.get("leases");
    if (leases == null || !leases.isArray()) {
      throw new UnreadableAnswerException(200, "no leases in " + answer);
    }
    for (JsonNode lease : leases) {
      Answer m = new Answer(lease, 200);
      members.add(new Session.Member(m.string("lease_id"), m.string("lock"), m.u64("epoch")));
    }
    return new Session(a.string("session_id"), a.string("holder"), a.u64("ttl_ms"), a.u64("remaining_ms"), members);
  }

  private static byte[] decodeValue(String base64) throws UnreadableAnswerException {
    try {
      return Base64.getDecoder().decode(base64);
    } catch (IllegalArgumentException e) {
      throw new UnreadableAnswerException(200, "a value that is not base64: " + base64);
    }
  }

  private static String query(String text) {
    return java.net.URLEncoder.encode(text, StandardCharsets.UTF_8).replace("+", "%20");
  }

  /**
   * A key's path: each {@code /}-separated segment of the key encoded on its own, the
   * separators kept (the server reads {@code a%2Fb} and {@code a/b} as the same key).
   */
  static String kvPath(String lock, String key) {
    if (key.isEmpty()) {
      throw new IllegalArgumentException("key must not be empty");
    }
    StringBuilder path = new StringBuilder("/v1/kv/").append(name("lock name", lock));
    for (String part : key.split("/", -1)) {
      if (part.equals(".") || part.equals("..")) {
        throw new IllegalArgumentException(
            "key \"" + key + "\" has a \"" + part + "\" segment, which URL normalisation would remove");
      }
      path.append('/').append(segment(part));
    }
    return path.toString();
  }

  /**
   * A name that is exactly one path segment (a lock name, a lease id), encoded. Empty,
   * {@code .} and {@code ..} are refused before anything is sent: URL normalisation (here,
   * or in a proxy) would remove them and silently address another key or route.
   */
  static String name(String what, String value) {
    if (value.isEmpty() || value.equals(".") || value.equals("..")) {
      throw new IllegalArgumentException(what + " \"" + value + "\" cannot be sent in a URL path");
    }
    return segment(value);
  }

  /** Percent-encodes one path segment: every byte but the unreserved characters of RFC 3986. */
  static String segment(String text) {
    StringBuilder b = new StringBuilder(text.length());
    for (byte raw : text.getBytes(StandardCharsets.UTF_8)) {
      int c = raw & 0xff;
      boolean unreserved =
          c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
              || c == '-' || c == '.' || c == '_' || c == '~';
      if (unreserved) {
        b.append((char) c);
      } else {
        b.append('%').append(Character.toUpperCase(Character.forDigit(c >> 4, 16)))
            .append(Character.toUpperCase(Character.forDigit(c & 0xf, 16)));
      }
    }
    return b.toString();
  }

  /** A success's JSON, read strictly: a missing or mistyped field is an unreadable answer. */
  private record Answer(JsonNode node, int status) {
    String string(String name) throws UnreadableAnswerException {
      JsonNode v = node.get(name);
      if (v == null || !v.isTextual()) {
        throw new UnreadableAnswerException(status, "no text field " + name + " in " + node);
      }
      return v.textValue();
    }

    String optString(String name) throws UnreadableAnswerException {
      JsonNode v = node.get(name);
      return v == null || v.isNull() ? null : string(name);
    }

    long u64(String name) throws UnreadableAnswerException {
      JsonNode v = node.get(name);
      if (v == null || !v.isIntegralNumber() || v.bigIntegerValue().signum() < 0
          || v.bigIntegerValue().bitLength() > 64) {
        throw new UnreadableAnswerException(status, "no integer field " + name + " in " + node);
      }
      return v.bigIntegerValue().longValue();
    }

    Long optU64(String name) throws UnreadableAnswerException {
      JsonNode v = node.get(name);
      return v == null || v.isNull() ? null : u64(name);
    }

    boolean bool(String name) throws UnreadableAnswerException {
      JsonNode v = node.get(name);
      if (v == null || !v.isBoolean()) {
        throw new UnreadableAnswerException(status, "no boolean field " + name + " in " + node);
      }
      return v.booleanValue();
    }
  }
}
