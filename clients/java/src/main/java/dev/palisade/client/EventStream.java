// The live events of a lock or of every lock, as typed events, reconnecting with resume.
package dev.palisade.client;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import dev.palisade.client.Transport.Call;
import dev.palisade.client.Transport.Retry;
import java.io.BufferedInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

/**
 * The server's live events as {@link LockEvent}s, read on a daemon thread. The stream
 * reconnects by itself when its connection drops or goes quiet (the server sends a comment
 * every 15 s; nothing for 45 s counts as a dead connection), sending the id of the last
 * event it delivered as {@code Last-Event-ID}, so nothing is skipped while the server still
 * holds it; when it no longer does (or restarted, or the stream moved to another node), the
 * stream yields a {@link LockEvent.Reset} first: read the state again. Each connection goes
 * through the client's endpoints like any read.
 *
 * <p>Failures that may pass (the network, 429 too many streams, 503) are retried after a
 * pause (0.1 s, doubling to 5 s); the last one is kept in {@link #lastError}. A refusal
 * that retrying will not change (401, 403, 400, 404) ends the stream: {@link #next} throws
 * it. Memory is bounded: a line longer than 64 KiB is dropped whole, and a consumer that
 * falls behind by 1,024 events stops the reading (the server then resets it as lagged).
 */
public final class EventStream implements AutoCloseable {
  static final int MAX_LINE = 64 * 1024;
  private static final long IDLE_LIMIT_MS = 45_000;
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final Set<String> PASSING = Set.of("quota_exceeded", "unavailable", "storage_failed");

  private final Transport transport;
  private final String path;
  private final Duration timeout;
  private final BlockingQueue<Object> queue = new ArrayBlockingQueue<>(1024);
  private final Thread reader;
  private final ScheduledExecutorService watchdog;
  private volatile boolean closed;
  private volatile InputStream current;
  private volatile long lastDataAt = System.nanoTime();
  private volatile IOException lastError;
  private long lastEventId = -1;
  private PalisadeException ended;

  EventStream(Transport transport, String path, Duration timeout) {
    this.transport = transport;
    this.path = path;
    this.timeout = timeout;
    this.watchdog =
        Executors.newSingleThreadScheduledExecutor(
            r -> {
              Thread t = new Thread(r, "palisade-events-watchdog");
              t.setDaemon(true);
              return t;
            });
    watchdog.scheduleWithFixedDelay(this::closeIfIdle, 5, 5, TimeUnit.SECONDS);
    this.reader = new Thread(this::run, "palisade-events");
    reader.setDaemon(true);
    reader.start();
  }

  /**
   * The next event, waiting for it as long as it takes. Throws the refusal that ended the
   * stream, or an {@link IOException} once the stream is closed.
   */
  public LockEvent next() throws IOException, InterruptedException {
    while (true) {
      LockEvent event = poll(Duration.ofMillis(200));
      if (event != null) {
        return event;
      }
    }
  }

  /** The next event within {@code wait}, or null; throws as {@link #next} does. */
  public LockEvent poll(Duration wait) throws IOException, InterruptedException {
    if (ended != null) {
      throw ended;
    }
    Object item = queue.poll(wait.toMillis(), TimeUnit.MILLISECONDS);
    if (item instanceof LockEvent event) {
      return event;
    }
    if (item instanceof PalisadeException refusal) {
      ended = refusal;
      throw refusal;
    }
    if (closed) {
      throw new IOException("the event stream is closed");
    }
    return null;
  }

  /** The last failure the stream retried after (null when none). */
  public IOException lastError() {
    return lastError;
  }

  /** Stops reading and closes the connection. */
  @Override
  public void close() {
    closed = true;
    watchdog.shutdownNow();
    closeCurrent();
    reader.interrupt();
  }

  private void run() {
    long backoffMs = 100;
    while (!closed) {
      try {
        Map<String, String> headers =
            lastEventId >= 0 ? Map.of("Last-Event-ID", Long.toUnsignedString(lastEventId), "Accept", "text/event-stream")
                : Map.of("Accept", "text/event-stream");
        HttpResponse<InputStream> response =
            transport.send(new Call("GET", path, null, headers, timeout, Retry.SAFE), HttpResponse.BodyHandlers.ofInputStream());
        if (response.statusCode() != 200) {
          byte[] body;
          try (InputStream in = response.body()) {
            body = in.readNBytes(MAX_LINE);
          }
          IOException refusal = PalisadeException.parse(response.statusCode(), body);
          if (refusal instanceof PalisadeException p && !PASSING.contains(p.code())) {
            queue.put(p);
            return;
          }
          throw refusal;
        }
        current = response.body();
        lastDataAt = System.nanoTime();
        backoffMs = 100;
        read(new BufferedInputStream(current));
        lastError = new IOException("the event stream ended");
      } catch (InterruptedException e) {
        return;
      } catch (IOException e) {
        if (closed) {
          return;
        }
        lastError = e;
      } finally {
        closeCurrent();
      }
      try {
        Thread.sleep(backoffMs);
      } catch (InterruptedException e) {
        return;
      }
      backoffMs = Math.min(backoffMs * 2, 5_000);
    }
  }

  /** Reads events until the connection ends: SSE lines, an event at each blank line. */
  private void read(InputStream in) throws IOException, InterruptedException {
    ByteArrayOutputStream line = new ByteArrayOutputStream();
    boolean dropping = false;
    StringBuilder data = null;
    int b;
    while ((b = in.read()) != -1) {
      lastDataAt = System.nanoTime();
      if (b != '\n') {
        if (!dropping && line.size() >= MAX_LINE) {
          dropping = true; // a line this long is no event of ours: drop it whole
          line.reset();
        }
        if (!dropping) {
          line.write(b);
        }
        continue;
      }
      if (dropping) {
        dropping = false;
        data = null; // the event it belonged to is dropped too
        continue;
      }
      String text = line.toString(StandardCharsets.UTF_8);
      line.reset();
      if (text.endsWith("\r")) {
        text = text.substring(0, text.length() - 1);
      }
      if (text.isEmpty()) {
        if (data != null) {
          LockEvent event = parse(data.toString());
          if (event != null) {
            lastEventId = event.id();
            queue.put(event);
          }
        }
        data = null;
      } else if (text.startsWith("data:")) {
        String value = text.substring(5).startsWith(" ") ? text.substring(6) : text.substring(5);
        if (data == null) {
          data = new StringBuilder(value);
        } else if (data.length() + value.length() < MAX_LINE) {
          data.append('\n').append(value);
        } else {
          data = null;
        }
      }
      // "event:", "id:" (the id is in the data too) and ":" comments need nothing.
    }
  }

  private void closeIfIdle() {
    if (System.nanoTime() - lastDataAt > TimeUnit.MILLISECONDS.toNanos(IDLE_LIMIT_MS)) {
      closeCurrent(); // the reader sees the connection end and reconnects
    }
  }

  private void closeCurrent() {
    InputStream in = current;
    current = null;
    if (in != null) {
      try {
        in.close();
      } catch (IOException ignored) {
        // closing a dead connection: nothing more to do
      }
    }
  }

  /** The event in one {@code data:} value, or null for a type this version does not know. */
  static LockEvent parse(String data) throws IOException {
    JsonNode e = JSON.readTree(data);
    if (e == null || !e.isObject()) {
      throw new IOException("an event that is not a JSON object: " + data);
    }
    Fields j = new Fields(e);
    long id = j.u64("id");
    long at = j.u64("at_ms");
    return switch (j.string("type")) {
      case "granted" -> new LockEvent.Granted(id, at, j.string("lock"), j.u64("epoch"), j.string("holder"), j.u64("ttl_ms"));
      case "released" -> new LockEvent.Released(id, at, j.string("lock"), j.u64("epoch"), j.string("holder"), j.string("cause"));
      case "expired" -> new LockEvent.Expired(id, at, j.string("lock"), j.u64("epoch"), j.string("holder"));
      case "fenced" -> new LockEvent.MarkAdvanced(id, at, j.string("lock"), j.u64("high_water"), j.u64("seq"));
      case "rejected" -> new LockEvent.Rejected(id, at, j.string("lock"), j.string("code"), j.optU64("epoch"), j.optU64("high_water"));
      case "reset" -> new LockEvent.Reset(id, at, j.string("reason"));
      default -> null;
    };
  }

  /** Strict field reads of one event: a missing or mistyped field fails the connection. */
  private record Fields(JsonNode node) {
    String string(String name) throws IOException {
      JsonNode v = node.get(name);
      if (v == null || !v.isTextual()) {
        throw new IOException("an event without text field " + name + ": " + node);
      }
      return v.textValue();
    }

    long u64(String name) throws IOException {
      JsonNode v = node.get(name);
      if (v == null || !v.isIntegralNumber() || v.bigIntegerValue().signum() < 0 || v.bigIntegerValue().bitLength() > 64) {
        throw new IOException("an event without integer field " + name + ": " + node);
      }
      return v.bigIntegerValue().longValue();
    }

    Long optU64(String name) throws IOException {
      JsonNode v = node.get(name);
      return v == null || v.isNull() ? null : u64(name);
    }
  }
}
