"""What a bot gets: recognising a bot request, the serve decision, replies, origin rules and policy."""
