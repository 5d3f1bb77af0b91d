"""Generated protobuf code for MAGIC's stream messages (see proto/)."""
