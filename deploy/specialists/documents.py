"""Document tasks for the eagle head's corpus, written by the target itself: texts, then work on them.

The specialists' training prompts (deploy/specialists/tasks.py) are short requests; the bench also
asks for work on a given text (summarise, extract, rewrite), where answers copy from the prompt.
`document_examples(target, n)` makes such examples with no data from outside: the target first
writes a short text on each of n topics (`TOPICS`: subjects x angles written here, none of them a
bench prompt's subject), then answers one instruction (`INSTRUCTIONS`) about each of its texts.
Seeded, so a build is reproducible; the examples are the second stage's (prompt, answer) pairs.
"""
from __future__ import annotations

import random

from deploy.engine.target import TargetModel
from actors.task_corpus import Example
from deploy.specialists.corpus import target_outputs

SUBJECTS = [
    "lighthouses", "glaciers", "coffee farming", "electric bicycles", "public libraries", "tide pools", "chess openings",
    "sourdough bread", "wind turbines", "desert foxes", "paper recycling", "city parks", "night trains", "coral reefs",
    "solar panels", "vintage cameras", "urban gardens", "mountain rescue teams", "board game cafes", "recycling plants",
    "jazz festivals", "street markets", "hot air balloons", "migratory birds", "school lunches", "ferry services",
    "volunteer firefighters", "bicycle lanes", "home composting", "museum audio guides", "rainwater tanks",
    "tea ceremonies", "ice hockey", "sea turtles", "paper maps", "online courses", "farmers' cooperatives", "violin making",
    "snow plows", "community radio", "seed banks", "car sharing", "marathon training", "lunar eclipses", "rooftop bars",
    "beekeeping suits", "river cruises", "apartment insulation", "food trucks", "sign language",
]
ANGLES = ["a short history of {}", "how {} work in practice", "the main benefits and drawbacks of {}",
          "a typical day for people who work with {}"]
INSTRUCTIONS = [
    "Summarize this text in two sentences.", "List the key facts of this text as bullet points.",
    "Rewrite this text in a formal tone, keeping all the facts.", "Give this text a title and a one-sentence summary.",
    "Extract every number and what it refers to from this text.", "Write three questions that this text answers.",
    "Rewrite this text for a ten-year-old.", "Turn this text into a JSON object with the fields topic, facts and tone.",
]


def topics(n: int, seed: int = 0) -> list[str]:
    """n distinct topics (at most len(SUBJECTS) * len(ANGLES))."""
    rng = random.Random(f"documents:{seed}")
    every = [angle.format(subject) for subject in SUBJECTS for angle in ANGLES]
    return rng.sample(every, min(n, len(every)))


def document_examples(target: TargetModel, n: int = 160, max_new_tokens: int = 128, seed: int = 0,
                      progress: bool = False) -> list[Example]:
    """The target's texts on n topics, then its answers to an instruction about each text."""
    rng = random.Random(f"instructions:{seed}")
    writes = [[{"role": "user", "content": f"Write a short informative text about {topic}."}] for topic in topics(n, seed)]
    texts = [target.decode(e.output_ids).strip() for e in target_outputs(target, writes, max_new_tokens, progress=progress)]
    work = [[{"role": "user", "content": f"{rng.choice(INSTRUCTIONS)}\n\n{text}"}] for text in texts if text]
    return target_outputs(target, work, max_new_tokens, progress=progress)
