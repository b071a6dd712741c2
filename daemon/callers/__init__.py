"""Who is calling and how much they may hold: shared by both edges (gRPC and HTTP), so neither
edge imports the other."""
