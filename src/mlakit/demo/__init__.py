"""`make demo`: a seeded random DeepSeek-V3-architecture model (`checkpoint`), generated through
mlakit (`run`) and checked against transformers token by token, teacher-forced (`verdict`)."""
