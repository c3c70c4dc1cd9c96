"""MTP: DeepSeek-V3-style modules on the target hidden state and the next token's embedding."""
