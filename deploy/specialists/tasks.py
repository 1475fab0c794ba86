"""Training prompts for the specialist tasks, generated from the project's own templates.

`training_prompts(task, n, seed)` returns n distinct chat prompts for `code`, `math`,
`translation`, `chat` or `qa`, drawn from templates and fillers written here (seeded, so a build
is reproducible). They share the bench tasks' style but never their text (tests/specialists/test_specialists.py
checks that no training prompt equals a prompt of deploy/prompts/*.jsonl), and the chat and qa
fillers leave out the mixed set's chat and qa subjects (no ocean poem, no capital of Australia).
`python -m deploy.specialists.tasks` writes them to deploy/prompts/train/<task>.jsonl (the
shipped files).
"""
from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

SPECIALIST_TASKS = ("code", "math", "translation", "chat", "qa")
TRAIN_PROMPTS_PER_TASK = 160

_FUNCTIONS = [
    ("count_vowels(text: str) -> int", "counts the vowels in a string"),
    ("flatten(nested: list) -> list", "flattens a list of lists by one level"),
    ("is_prime(n: int) -> bool", "tells whether n is a prime number"),
    ("word_frequencies(text: str) -> dict[str, int]", "counts how often each word occurs, ignoring case"),
    ("merge_sorted(a: list[int], b: list[int]) -> list[int]", "merges two sorted lists into one sorted list"),
    ("fibonacci(n: int) -> list[int]", "returns the first n Fibonacci numbers"),
    ("chunk(items: list, size: int) -> list[list]", "splits a list into chunks of the given size"),
    ("celsius_to_fahrenheit(c: float) -> float", "converts a temperature from Celsius to Fahrenheit"),
    ("remove_duplicates(items: list) -> list", "removes duplicates while keeping the original order"),
    ("second_largest(numbers: list[int]) -> int", "returns the second largest distinct number"),
    ("capitalize_words(sentence: str) -> str", "capitalizes the first letter of every word"),
    ("gcd(a: int, b: int) -> int", "computes the greatest common divisor with Euclid's algorithm"),
    ("binary_search(items: list[int], target: int) -> int", "returns the index of target in a sorted list, or -1"),
    ("transpose(matrix: list[list[int]]) -> list[list[int]]", "transposes a matrix given as a list of rows"),
    ("read_csv_rows(path: str) -> list[dict]", "reads a CSV file into a list of dictionaries"),
    ("factorial(n: int) -> int", "computes n! iteratively and rejects negative n"),
    ("rotate_list(items: list, k: int) -> list", "rotates a list to the right by k positions"),
    ("average(numbers: list[float]) -> float", "returns the mean of a list and raises ValueError if it is empty"),
    ("is_anagram(a: str, b: str) -> bool", "tells whether two words are anagrams"),
    ("parse_date(text: str) -> datetime.date", "parses a date written as YYYY-MM-DD"),
    ("find_max_index(numbers: list[int]) -> int", "returns the index of the largest number"),
    ("reverse_words(sentence: str) -> str", "reverses the order of the words in a sentence"),
    ("digits_sum(n: int) -> int", "returns the sum of the decimal digits of n"),
    ("group_by_length(words: list[str]) -> dict[int, list[str]]", "groups words by their length"),
]
_CLASSES = [
    ("Queue", "enqueue, dequeue, peek and is_empty", "collections.deque"),
    ("BankAccount", "deposit, withdraw and balance", "a float attribute"),
    ("Counter", "increment, decrement, reset and value", "an int attribute"),
    ("TodoList", "add, remove, complete and pending", "a list of dictionaries"),
    ("Matrix", "add, multiply and transpose", "a list of lists"),
    ("LRUCache", "get and put with a fixed capacity", "an OrderedDict"),
    ("Inventory", "add_item, remove_item and total_value", "a dict of item names to quantities"),
    ("Temperature", "to_celsius, to_fahrenheit and __str__", "a float attribute in kelvin"),
]
_CODE_STYLES = ["", " Include a docstring.", " Include a docstring and an example call.", " Add type hints and comments.",
                " Keep it short.", " Explain how it works after the code."]
_LANGUAGES = ["JavaScript", "Python", "TypeScript"]


def _code(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.55:
        signature, what = rng.choice(_FUNCTIONS)
        return f"Write a Python function `{signature}` that {what}.{rng.choice(_CODE_STYLES)}"
    if kind < 0.75:
        name, methods, backing = rng.choice(_CLASSES)
        return f"Write a Python class `{name}` with methods {methods}, backed by {backing}.{rng.choice(_CODE_STYLES)}"
    if kind < 0.9:
        _, what = rng.choice(_FUNCTIONS)
        return f"Write a {rng.choice(_LANGUAGES)} function that {what}.{rng.choice(_CODE_STYLES)}"
    table, column = rng.choice([("employees", "salary"), ("products", "price"), ("students", "grade"), ("sales", "amount")])
    n = rng.randint(3, 10)
    return f"Write a SQL query that returns the {n} rows of the table {table} with the highest {column}, highest first."


_ITEMS = ["apples", "notebooks", "tickets", "bottles of water", "pens", "cookies", "books", "shirts", "oranges", "cups"]
_NAMES = ["Maria", "Tom", "Aisha", "Kenji", "Lucas", "Sofia", "Omar", "Emma", "Ravi", "Nina"]


def _math(rng: random.Random) -> str:
    kind = rng.randrange(7)
    a, b, c = rng.randint(2, 12), rng.randint(2, 40), rng.randint(10, 200)
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    if kind == 0:
        return f"Solve for x: {a}x - {b} = {c}. Explain each step."
    if kind == 1:
        return f"What is {rng.choice([5, 10, 12, 20, 25, 30, 40])}% of {c * 2}? Show your work."
    if kind == 2:
        return f"{name} buys {a} {item} at {b} dollars each and pays with a {c * 5} dollar bill. How much change does {name} get? Show your work."
    if kind == 3:
        return (f"A car travels {c} kilometers in {a} hours. At the same speed, how far does it travel in {a + 3} hours? "
                "Show the calculation.")
    if kind == 4:
        return f"A rectangle is {a} meters wide and {b} meters long. What are its area and its perimeter? Explain step by step."
    if kind == 5:
        scores = ", ".join(str(rng.randint(50, 100)) for _ in range(rng.randint(4, 7)))
        return f"The test scores of a class are {scores}. What is the average score? Show the calculation."
    return f"{name} saves {b} dollars every week. How many weeks does it take to save {c * 10} dollars? Explain your reasoning."


_SUBJECTS = ["My sister", "The teacher", "Our neighbor", "The little boy", "My friend", "The doctor", "The old man", "Her cousin"]
_ACTIONS = ["is cooking dinner for the whole family", "will visit the museum next weekend", "bought a new bicycle yesterday",
            "is reading a book about history", "wants to learn how to play the guitar", "forgot the keys at the office",
            "usually takes the bus to work", "is planting flowers in the garden", "called the hotel to book a room",
            "is looking for a cheap apartment near the station"]
_TAILS = ["", " because it is raining", " before the shops close", " with a big smile", " after a long day",
          " even though it is very late", " and everyone is happy about it"]
_TARGET_LANGUAGES = ["French", "Spanish", "German", "Italian"]
_TRANSLATE = ["Translate to {lang}: {text}", "Translate this sentence into {lang}: {text}",
              "Translate the following English text to {lang}:\n\n{text}", "How do you say this in {lang}? {text}"]


def _translation(rng: random.Random) -> str:
    sentences = [f"{rng.choice(_SUBJECTS)} {rng.choice(_ACTIONS)}{rng.choice(_TAILS)}." for _ in range(rng.randint(1, 3))]
    return rng.choice(_TRANSLATE).format(lang=rng.choice(_TARGET_LANGUAGES), text=" ".join(sentences))


_HEROES = ["a shy cat", "an old lighthouse keeper", "a young dragon", "a lost puppy", "a tiny ant", "a clumsy wizard",
           "a girl who lives on a farm", "a retired astronaut", "a curious owl", "a baker in a small village"]
_QUESTS = ["learns to swim", "finds a secret door in the library", "makes an unlikely friend", "loses a magic key",
           "wants to see the mountains", "opens a bakery", "is afraid of the dark", "builds a boat", "learns to play the violin",
           "travels to the city for the first time"]
_POEM_THEMES = ["autumn leaves", "a rainy morning", "the mountains in winter", "a quiet library", "city lights",
                "a garden in spring", "the first snow", "an old oak tree", "friendship", "the desert at noon", "a train journey",
                "a summer storm"]
_WORRIES = [("have an important exam next week", "stressed"), ("am moving to a new city alone", "anxious"),
            ("start a new job on Monday", "worried"), ("have to give a speech at my friend's wedding", "nervous"),
            ("have too many tasks at work", "overwhelmed"), ("just finished a big project", "tired and a bit empty"),
            ("have to tell my roommate something difficult", "uneasy"), ("am learning to drive", "scared")]
_PLANS = ["a productive Monday morning", "a day trip to the countryside", "learning to cook in one month",
          "a birthday party for a seven-year-old", "a cheap holiday by the sea", "starting to run three times a week",
          "cleaning out a messy garage", "a cozy evening with friends", "learning to draw in thirty days"]
_HABIT_GOALS = ["sleeping better", "saving money", "learning a new language", "staying focused while studying",
                "keeping a tidy house", "eating more vegetables", "reading more books", "drinking enough water",
                "spending less time on the phone"]
_CHAT_TAILS = ["", " Keep it short.", " Please be brief.", " Make it fun."]


def _chat(rng: random.Random) -> str:
    kind, tail = rng.randrange(6), rng.choice(_CHAT_TAILS)
    if kind == 0:
        return f"Tell me a short story about {rng.choice(_HEROES)} who {rng.choice(_QUESTS)}.{tail}"
    if kind == 1:
        return f"Write a short poem about {rng.choice(_POEM_THEMES)}.{tail}"
    if kind == 2:
        situation, feeling = rng.choice(_WORRIES)
        return f"I {situation} and I feel {feeling}. Any advice?{tail}"
    if kind == 3:
        return f"Can you suggest a simple plan for {rng.choice(_PLANS)}?{tail}"
    if kind == 4:
        return f"What are some good habits for {rng.choice(_HABIT_GOALS)}?{tail}"
    return f"Give me {rng.randint(3, 6)} ideas for {rng.choice(_PLANS)}.{tail}"


_CAPITALS = [("Canada", "Toronto"), ("Brazil", "Rio de Janeiro"), ("Turkey", "Istanbul"), ("Switzerland", "Zurich"),
             ("the United States", "New York"), ("Nigeria", "Lagos"), ("India", "Mumbai"), ("New Zealand", "Auckland"),
             ("Morocco", "Casablanca"), ("Vietnam", "Ho Chi Minh City")]
_WHY = ["do leaves change color in autumn", "is the sea salty", "do we have seasons", "does ice float on water",
        "do cats purr", "are sunsets red", "do birds migrate", "does bread rise", "do we yawn", "does the moon have phases",
        "do onions make us cry", "is the grass green"]
_BOOKS = ["Moby-Dick", "Nineteen Eighty-Four", "Hamlet", "The Odyssey", "Don Quixote", "War and Peace", "Frankenstein",
          "The Great Gatsby", "Jane Eyre", "Romeo and Juliet", "The Little Prince", "Crime and Punishment"]
_CONTEXTS = [
    ("The Nile is about 6,650 kilometers long and flows north through eleven countries before it reaches the Mediterranean Sea.",
     "Into which sea does the Nile flow, and how long is it?"),
    ("Mount Everest, on the border between Nepal and China, is 8,849 meters high. It was first climbed in 1953.",
     "How high is Mount Everest, and when was it first climbed?"),
    ("The Great Wall of China was built over many centuries, mostly to protect against invasions from the north.",
     "Why was the Great Wall of China built?"),
    ("Honey never spoils because it holds very little water and is slightly acidic, so bacteria cannot grow in it.",
     "Why does honey not spoil?"),
    ("The Sahara is the largest hot desert in the world and covers most of North Africa.",
     "Where is the Sahara, and what is special about its size?"),
    ("Penguins cannot fly, but their wings work like flippers, which makes them excellent swimmers.",
     "Can penguins fly, and what do they use their wings for?"),
    ("The Eiffel Tower was built for the 1889 World's Fair in Paris and was at first criticized by many artists.",
     "For which event was the Eiffel Tower built, and how did artists react to it?"),
    ("Bamboo is a grass, not a tree, and some species can grow almost one meter in a single day.",
     "Is bamboo a tree, and how fast can it grow?"),
]
_DIFFERENCES = [("a virus", "a bacterium"), ("a lake", "a sea"), ("speed", "velocity"), ("a comet", "an asteroid"),
                ("a simile", "a metaphor"), ("mass", "weight"), ("an alligator", "a crocodile"), ("a democracy", "a monarchy"),
                ("baking soda", "baking powder"), ("a frog", "a toad"), ("an ocean current", "a tide"), ("a fruit", "a vegetable")]
_HOW = ["a rainbow form", "a refrigerator keep food cold", "photosynthesis work", "a vaccine protect us",
        "an airplane stay in the air", "a compass find north", "the heart pump blood", "a volcano erupt"]  # after "How does"
_QA_TAILS = ["", " Answer in a short paragraph.", " Keep the answer brief.", " Explain it simply."]


def _qa(rng: random.Random) -> str:
    kind, tail = rng.randrange(6), rng.choice(_QA_TAILS)
    if kind == 0:
        country, city = rng.choice(_CAPITALS)
        return rng.choice([f"What is the capital of {country}, and why is it not {city}?", f"What is the capital of {country}?{tail}"])
    if kind == 1:
        return f"Why {rng.choice(_WHY)}?{tail}"
    if kind == 2:
        return f"Who wrote {rng.choice(_BOOKS)}, and what is it about?{tail}"
    if kind == 3:
        context, question = rng.choice(_CONTEXTS)
        return f"Context: {context}\n\nQuestion: {question}"
    if kind == 4:
        a, b = rng.choice(_DIFFERENCES)
        return f"What is the difference between {a} and {b}?{tail}"
    return f"How does {rng.choice(_HOW)}?{tail}"


_GENERATORS: dict[str, Callable[[random.Random], str]] = {
    "code": _code, "math": _math, "translation": _translation, "chat": _chat, "qa": _qa,
}


def training_prompts(task: str, n: int, seed: int = 0) -> list[list[dict[str, str]]]:
    """n distinct chat prompts ([{"role": "user", "content": ...}]) for the task."""
    if task not in _GENERATORS:
        from actors.errors import InvalidRequestError

        raise InvalidRequestError("task", f"unknown specialist task {task!r}; known: {list(SPECIALIST_TASKS)}")
    rng = random.Random(f"{task}:{seed}")
    seen: dict[str, None] = {}
    for _ in range(n * 50):
        if len(seen) == n:
            break
        seen.setdefault(_GENERATORS[task](rng))
    return [[{"role": "user", "content": text}] for text in seen]


def write_training_files(out_dir: Path, n: int = TRAIN_PROMPTS_PER_TASK) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for task in SPECIALIST_TASKS:
        rows = [{"id": f"{task}-train-{i:03d}", "task": task, "messages": messages}
                for i, messages in enumerate(training_prompts(task, n))]
        (out_dir / f"{task}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


if __name__ == "__main__":
    write_training_files(Path(__file__).resolve().parent.parent / "prompts" / "train")
