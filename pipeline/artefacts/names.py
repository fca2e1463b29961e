"""File names and schema tags other code needs without loading pydantic (the Triton model stubs
import ``pipeline.reference.api``, which re-exports these). Reads and writes nothing."""

ENGINE_DESCRIPTOR = "engine.json"
ENGINE_FORMAT = "specdeploy-reference-engine/1"
