"""Answers before any GPU time is spent: the memory model (`memory`), the plan and its suggestions
(`plan`), and the accelerator table (`hardware`) that MFU also uses. No Paddle."""
