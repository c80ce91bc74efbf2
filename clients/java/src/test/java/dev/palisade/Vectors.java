// The shared test vectors of the repository's vectors/ folder, for every suite that runs them.
package dev.palisade;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;

/** Finds and reads the vectors files (made by the Rust side) the tests check against. */
public final class Vectors {
  private Vectors() {}

  /** The vectors folder: PALISADE_VECTORS (set by the pom), or the repository's. */
  public static Path dir() {
    String dir = System.getenv("PALISADE_VECTORS");
    return Path.of(dir != null ? dir : "../../vectors");
  }

  /** The JSON file {@code name} of the vectors folder. */
  public static JsonNode read(String name) throws IOException {
    return new ObjectMapper().readTree(Files.readAllBytes(dir().resolve(name)));
  }
}
