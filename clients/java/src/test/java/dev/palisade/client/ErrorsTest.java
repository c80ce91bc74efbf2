// Every error answer the server can send decodes into its typed exception with its fields.
package dev.palisade.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import dev.palisade.Vectors;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import java.util.Set;
import org.junit.jupiter.api.Test;

class ErrorsTest {
  private static final ObjectMapper JSON = new ObjectMapper();

  /** Codes this client reads as the plain PalisadeException on purpose: nothing to branch on. */
  private static final Set<String> PLAIN =
      Set.of(
          "bad_request", "method_not_allowed", "uri_too_long", "headers_too_large",
          "unauthenticated", "missing_token", "invalid_token",
          "session_expired", "idempotency_conflict", "storage_failed", "unavailable");

  /**
   * Every answer of vectors/errors.json (made from the server's own definitions, one per
   * code and shape) decodes into its typed exception carrying exactly the answer's fields,
   * with the answer's code and status; a code neither typed nor known plain fails the test.
   */
  @Test
  void everyErrorTheServerCanSendDecodesWithItsFields() throws IOException {
    JsonNode file = Vectors.read("errors.json");
    int run = 0;
    for (JsonNode answer : file.get("answers")) {
      int status = answer.get("status").asInt();
      JsonNode error = answer.get("body").get("error");
      String code = error.get("code").asText();
      IOException decoded = PalisadeException.parse(status, JSON.writeValueAsBytes(answer.get("body")));
      PalisadeException typed = assertInstanceOf(PalisadeException.class, decoded, code);
      assertEquals(code, typed.code());
      assertEquals(status, typed.status());
      assertEquals(PLAIN.contains(code), typed.getClass() == PalisadeException.class, code + " as " + typed.getClass());
      if (!PLAIN.contains(code)) {
        Map<String, Object> want = new HashMap<>();
        for (Map.Entry<String, JsonNode> f : error.properties()) {
          if (!f.getKey().equals("code") && !f.getKey().equals("message")) {
            JsonNode v = f.getValue();
            want.put(f.getKey(), v.isNull() ? null : v.isNumber() ? (Object) v.longValue() : v.asText());
          }
        }
        // An optional field the server leaves out reads as null.
        typed.fields().keySet().forEach(name -> want.putIfAbsent(name, null));
        assertEquals(want, new HashMap<>(typed.fields()), code);
      }
      assertEquals(code.equals("stale_token") || code.equals("stale_sequence"), typed.isFenced());
      run++;
    }
    assertTrue(run >= 20, "only " + run + " answers");
  }

  /** A field of another type leaves the plain exception: no field is invented. */
  @Test
  void aMistypedFieldIsNotTyped() {
    String body = "{\"error\":{\"code\":\"stale_token\",\"message\":\"m\",\"high_water\":\"7\",\"epoch\":5}}";
    IOException decoded = PalisadeException.parse(409, body.getBytes(StandardCharsets.UTF_8));
    assertEquals(PalisadeException.class, decoded.getClass());
    assertEquals("stale_token", ((PalisadeException) decoded).code());
  }

  /** A body that is not a Palisade error is said so, with its status, never given a code. */
  @Test
  void aForeignBodyIsUnreadable() {
    for (String body : new String[] {"<html>bad gateway</html>", "", "{\"error\":\"x\"}", "{\"error\":{\"code\":7}}"}) {
      IOException decoded = PalisadeException.parse(502, body.getBytes(StandardCharsets.UTF_8));
      UnreadableAnswerException u = assertInstanceOf(UnreadableAnswerException.class, decoded, body);
      assertEquals(502, u.status());
      assertFalse(decoded instanceof PalisadeException);
    }
  }

  @Test
  void pathSegmentsArePercentEncoded() {
    assertEquals("a-b.c_d~e", PalisadeClient.segment("a-b.c_d~e"));
    assertEquals("a%2Fb%20c%C3%A9%3F", PalisadeClient.segment("a/b cé?"));
  }

  /** Keys keep their "/" segments; dot segments and empty names are refused, not sent. */
  @Test
  void dotSegmentsAreRefused() {
    assertEquals("/v1/kv/orders/dir/file%20name", PalisadeClient.kvPath("orders", "dir/file name"));
    assertEquals("/v1/kv/orders/a//b", PalisadeClient.kvPath("orders", "a//b"));
    for (String key : new String[] {"", ".", "..", "a/../b", "a/./b", "a/.."}) {
      assertThrows(IllegalArgumentException.class, () -> PalisadeClient.kvPath("orders", key), key);
    }
    for (String name : new String[] {"", ".", ".."}) {
      assertThrows(IllegalArgumentException.class, () -> PalisadeClient.name("lock name", name), name);
    }
  }
}
