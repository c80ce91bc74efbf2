// The request path: every call goes out here, to one endpoint of the deployment or the next.
package dev.palisade.client;

import java.io.IOException;
import java.net.ConnectException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpConnectTimeoutException;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.List;
import java.util.Map;

/**
 * Sends each {@link Call} to the endpoint that answered last, moving to the next one of the
 * deployment when the rule allows it ({@link #mayTryNext}, the Python and Rust clients'
 * rule): a call moves on when its endpoint could not be reached, or answered 503, except
 * that a call whose request may already have been applied moves on only if resending it
 * cannot apply it twice. Adds the bearer key; bounds the answer's size.
 */
final class Transport {
  /** How freely a call may be resent to the next endpoint. */
  enum Retry {
    /** Resending cannot change the outcome: reads, renewals, releases, token checks, and
     * writes with an idempotency key. */
    SAFE,
    /** Resent when no node got it or a node answered 503, not when the answer was lost (an
     * acquire: resending could take a second lease). */
    UNLESS_UNKNOWN,
    /** Resent only when it surely reached no node (a write without an idempotency key). */
    ONLY_UNREACHABLE
  }

  /** How one attempt on one endpoint failed. */
  enum Failure {
    /** Never sent: connection refused or timed out. */
    UNREACHABLE,
    /** The node answered 503. */
    UNAVAILABLE,
    /** Sent, and no answer came back: it may have been applied. */
    UNKNOWN
  }

  /** One call, ready to send to any endpoint: {@code {base}{path}}. */
  record Call(
      String method, String path, byte[] body, Map<String, String> headers, Duration timeout, Retry retry) {}

  private static final int MAX_ANSWER = 16 << 20;

  private final List<String> bases;
  private final HttpClient http;
  private final String bearer;
  /** The index of the endpoint that answered last: where the next call starts. */
  private volatile int preferred;

  Transport(List<String> bases, HttpClient http, String bearer) {
    this.bases = List.copyOf(bases);
    this.http = http;
    this.bearer = bearer;
  }

  /** Whether there is another endpoint to move to. */
  boolean failsOver() {
    return bases.size() > 1;
  }

  /** Whether a call of class {@code retry} may move on after {@code failure}. */
  static boolean mayTryNext(Retry retry, Failure failure) {
    return switch (failure) {
      case UNREACHABLE -> true;
      case UNAVAILABLE -> retry != Retry.ONLY_UNREACHABLE;
      case UNKNOWN -> retry == Retry.SAFE;
    };
  }

  /** The answer of the first endpoint that gave one the call may stop at. */
  HttpResponse<byte[]> send(Call call) throws IOException, InterruptedException {
    HttpResponse<byte[]> response = send(call, HttpResponse.BodyHandlers.ofByteArray());
    if (response.body().length > MAX_ANSWER) {
      throw new UnreadableAnswerException(response.statusCode(), "an answer over 16 MiB");
    }
    return response;
  }

  /**
   * {@link #send(Call)} with the body as {@code handler} reads it (a stream of events). A
   * 503 met on the way is passed on like any other; its body is read only when it is the
   * answer.
   */
  <T> HttpResponse<T> send(Call call, HttpResponse.BodyHandler<T> handler) throws IOException, InterruptedException {
    int start = preferred;
    IOException last = null;
    for (int i = 0; i < bases.size(); i++) {
      int at = (start + i) % bases.size();
      boolean more = i + 1 < bases.size();
      HttpResponse<T> response;
      try {
        response = http.send(request(bases.get(at), call), handler);
      } catch (ConnectException | HttpConnectTimeoutException unreachable) {
        last = unreachable;
        continue; // never sent: any call may move on
      } catch (IOException unknown) {
        if (more && mayTryNext(call.retry(), Failure.UNKNOWN)) {
          last = unknown;
          continue;
        }
        throw unknown;
      }
      if (response.statusCode() == 503 && more && mayTryNext(call.retry(), Failure.UNAVAILABLE)) {
        last = new IOException("HTTP 503 from " + bases.get(at));
        discard(response.body());
        continue;
      }
      preferred = at;
      return response;
    }
    throw last;
  }

  /** Lets go of a body that is not read (a stream's connection). */
  private static void discard(Object body) {
    if (body instanceof java.io.Closeable closeable) {
      try {
        closeable.close();
      } catch (IOException ignored) {
        // nothing to do: the body is dropped either way
      }
    }
  }

  private HttpRequest request(String base, Call call) {
    HttpRequest.Builder b = HttpRequest.newBuilder(URI.create(base + call.path())).timeout(call.timeout());
    call.headers().forEach(b::header);
    if (bearer != null) {
      b.header("Authorization", "Bearer " + bearer);
    }
    HttpRequest.BodyPublisher body =
        call.body() == null ? HttpRequest.BodyPublishers.noBody() : HttpRequest.BodyPublishers.ofByteArray(call.body());
    return b.method(call.method(), body).build();
  }
}
