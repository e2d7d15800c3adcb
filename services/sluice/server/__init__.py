"""The one gRPC server bootstrap every Sluice service runs on."""
