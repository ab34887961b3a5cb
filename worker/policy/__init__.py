"""What port 3000 refuses and why: the guards and their limits, admission, the signature, references,
and the drain (docs/security.md)."""
