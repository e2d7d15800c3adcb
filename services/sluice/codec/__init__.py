"""Wire and disk formats shared by the producer, the broker and the consumers."""
