"""Generated protobuf code. Regenerate with `make protos`; do not edit."""
