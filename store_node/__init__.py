"""The Chorus store node: archives SDS channels, serves them over gRPC, exports for analytics."""
