"""Task specialists for the embedded target: training prompts, target-output corpora, distilled
drafters and retrieval datastores, built once by `specfleet specialists` (`make specialists`)."""
