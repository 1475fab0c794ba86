"""The eagle corpus's requests: broad chat traffic composed here, in `STYLES`, with no data from outside.

`compose_jobs(n, seed)` -> n `Job`s, seeded and so reproducible. A job is one request or two
chained ones. Each is composed combinatorially from lists written here: subjects, people, numbers,
languages, formats and instructions. A chained job's second request is built from the target's
own first answer, so the target writes the material the second request works on:
- a document to summarise, rewrite or extract from;
- a code snippet to explain;
- a question it made up (self-instruct), which it then answers;
- its earlier turn in a multi-turn chat.
The styles:

    chat        open requests, advice, stories, poems, notes (one turn)
    multi-turn  a question, the target's answer, a follow-up (three turns)
    question    open questions: explain, compare, why and how
    code-write  write a function, class or query in one of several languages
    code-explain  the target writes code, then explains, reviews or converts it
    math        word problems with composed numbers, equations, percentages, units
    summarise   the target writes a document, then summarises it
    rewrite     ... then rewrites it (tone, tense, length, reader)
    extract     ... then extracts facts, names or numbers from it, as a list or JSON
    translate   sentences composed here, or the target's own, translated between 6 languages
    json        structured answers: JSON objects, tool calls against a declared function
    dialogue    dialogues and role play, and chat in French, Spanish, German, Italian, Portuguese
    self-instruct  the target writes a question or a task on a subject, then answers it

A job's `first` is a message list. Its `then` (or None) is a template for the second request:
- `then_mode` "embed": one user message, with `{answer}` replaced by the first answer's text;
- `then_mode` "follow": the first turn, the answer, then `then` as the next user message.
Overlap with the evaluation prompts is checked on the generated corpus (deploy/specialists/eagle_corpus.py).
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass

SUBJECTS = [
    "lighthouses", "glaciers", "coffee farming", "electric bicycles", "public libraries", "tide pools", "chess openings",
    "sourdough bread", "wind turbines", "desert foxes", "paper recycling", "night trains", "solar panels",
    "vintage cameras", "urban gardens", "mountain rescue teams", "board game cafes", "jazz festivals", "street markets",
    "hot air balloons", "migratory birds", "school lunches", "ferry services", "volunteer firefighters", "home composting",
    "museum audio guides", "rainwater tanks", "tea ceremonies", "ice hockey", "sea turtles", "paper maps",
    "farmers' cooperatives", "violin making", "snow plows", "community radio", "seed banks", "car sharing",
    "lunar eclipses", "food trucks", "sign language", "volcanoes", "submarines", "rice farming", "the printing press",
    "bridges", "vaccines", "recycling batteries", "earthquakes", "the stock market", "honey", "penguins",
    "photosynthesis in algae", "3D printers", "the Roman roads", "wool spinning", "bird watching", "kites",
    "mushroom foraging", "public transport apps", "cloud storage", "password managers", "spreadsheets", "podcasts",
    "the water cycle", "olive oil", "camping stoves", "rock climbing", "sailing", "tennis", "origami", "pottery",
    "knitting", "watercolour painting", "woodworking", "open source software", "robot vacuum cleaners", "smart watches",
    "bees in cities", "wolves", "octopuses", "cactus plants", "bamboo", "salt mines", "deserts at night",
    "the northern lights", "comets", "black holes", "microscopes", "telescopes", "thunderstorms", "tsunamis",
    "fossils", "dinosaurs", "the Silk Road", "medieval castles", "ancient Egypt", "the Vikings", "typewriters",
    "vinyl records", "electric cars", "hydrogen fuel", "nuclear power", "heat pumps", "insulation", "bike repair",
    "first aid", "sleep", "meditation", "dog training", "cat behaviour", "aquariums", "houseplants", "budgeting",
    "saving for retirement", "job interviews", "remote work", "learning a language", "public speaking", "time management",
]
PEOPLE = ["Lena", "Omar", "Priya", "Tomás", "Mei", "Jonas", "Amara", "Kenji", "Sofia", "Ravi", "Elif", "Mateo",
          "Hana", "Lucas", "Zara", "Noah", "Ingrid", "Diego", "Yara", "Felix"]
ITEMS = [("notebooks", "notebook"), ("apples", "apple"), ("tickets", "ticket"), ("bottles of juice", "bottle of juice"),
         ("pens", "pen"), ("loaves of bread", "loaf of bread"), ("plants", "plant"), ("chairs", "chair"),
         ("books", "book"), ("boxes of tea", "box of tea")]
LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese", "English"]
CODE_LANGUAGES = ["Python", "JavaScript", "TypeScript", "Go", "Rust", "Java", "C", "C++", "Ruby", "Bash"]
CODE_TASKS = [
    "counts how many times each word appears in a string", "returns the second largest number in a list",
    "checks whether two strings are anagrams", "merges two sorted lists into one sorted list",
    "removes duplicate values from a list while keeping the order", "converts a temperature from Celsius to Fahrenheit",
    "returns the n-th Fibonacci number iteratively", "finds the longest word in a sentence",
    "groups a list of people by their age", "validates that a password has at least 8 characters and one digit",
    "computes the average of the numbers in a file", "reverses the order of the words in a sentence",
    "flattens a nested list", "returns the most common element of a list", "checks whether a year is a leap year",
    "splits a list into chunks of a given size", "counts the vowels in a string", "finds the prime numbers below n",
    "parses a date string like 2024-05-17 into year, month and day", "rotates a list by k positions",
    "capitalises the first letter of every word", "computes the factorial of n", "sums the digits of an integer",
    "turns a list of pairs into a dictionary", "finds the intersection of two lists", "implements binary search",
    "checks whether brackets in a string are balanced", "converts a number to Roman numerals",
    "implements a simple queue with enqueue and dequeue", "computes the running total of a list",
]
SQL_TASKS = ["lists the ten most recent orders with their customer's name", "counts the employees in each department",
             "finds the products that were never ordered", "returns the average salary per job title",
             "lists the customers who placed more than three orders in 2023", "finds the best-selling product in each category"]
QUESTION_FORMS = [
    "Explain how {} work, in simple terms.", "What are the main advantages and disadvantages of {}?",
    "Why do people care about {}? Give three reasons.", "Give a short overview of the history of {}.",
    "What should a beginner know about {}?", "Describe three common misconceptions about {}.",
    "How have {} changed over the last fifty years?", "What is the most surprising fact about {}?",
    "Compare {} and {} in a short paragraph.", "What are the risks of {}, and how can they be reduced?",
]
CHAT_FORMS = [
    "Write a short story about {person} and {subject}.", "Write a poem of eight lines about {subject}.",
    "I want to get into {subject}. Where should I start?", "Give me five tips about {subject}.",
    "Write a friendly email to {person} inviting them to a talk about {subject}.",
    "Can you help me plan a weekend around {subject}?", "Write a short speech for a club that loves {subject}.",
    "My friend {person} is worried about {subject}. What could I say to help?",
    "Write a limerick about {subject}.", "Describe {subject} to someone who has never heard of it.",
    "Write a diary entry of a day spent learning about {subject}.", "Suggest a name and a slogan for a shop about {subject}.",
]
FOLLOW_UPS = [
    "Can you make that shorter?", "Thanks! Can you give me one concrete example?", "Why is that? Explain a bit more.",
    "Can you turn that into a bullet list?", "What would you recommend for a complete beginner?",
    "Which of those points matters most, and why?", "Now explain it as if I were ten years old.",
    "Can you add a few more details about the costs?", "What are the common mistakes people make here?",
    "Great. Can you summarise our conversation in two sentences?",
]
DOCUMENT_FORMS = [
    "Write a short news article about a town that started a project on {}.", "Write a short informative text about {}.",
    "Write a product review of something related to {}.", "Write a short email from a manager to a team about {}.",
    "Write the minutes of a short club meeting about {}, with names and decisions.",
    "Write a short blog post about a trip that involved {}, with dates and prices.",
]
SUMMARISE = ["Summarise this text in two sentences:\n\n{answer}", "Give the main points of this text as bullet points:\n\n{answer}",
             "Write a one-sentence summary of this text:\n\n{answer}", "Summarise this for a busy reader, in at most 40 words:\n\n{answer}"]
REWRITE = ["Rewrite this text in a formal tone:\n\n{answer}", "Rewrite this text in the past tense:\n\n{answer}",
           "Make this text shorter without losing facts:\n\n{answer}", "Rewrite this text for a child:\n\n{answer}",
           "Rewrite this text as a numbered list of steps or facts:\n\n{answer}", "Correct and improve the style of this text:\n\n{answer}",
           "Give this text a title, then rewrite it in a friendlier tone:\n\n{answer}"]
EXTRACT = ["List every name, place and number in this text:\n\n{answer}", "Extract the facts of this text as a JSON object:\n\n{answer}",
           "What are the dates and amounts mentioned in this text? Answer as a list.\n\n{answer}",
           "Write three questions that this text answers, with their answers:\n\n{answer}",
           "Extract the key terms of this text and define each in one line:\n\n{answer}"]
EXPLAIN_CODE = ["Explain what this code does, line by line:\n\n{answer}", "Review this code and suggest improvements:\n\n{answer}",
                "Write unit tests for this code:\n\n{answer}", "Add comments to this code:\n\n{answer}",
                "Rewrite this code in Python:\n\n{answer}", "What is the time complexity of this code? Explain.\n\n{answer}"]
SENTENCE_PARTS = (
    ["My neighbour", "The teacher", "Our team", "The old fisherman", "A young doctor", "The bakery", "My grandmother",
     "The city council", "The children", "Our guide"],
    ["visited", "talked about", "wrote a letter about", "spent the morning at", "finally understood", "asked me about",
     "took photos of", "read a book about"],
    ["{subject}", "the new museum", "the mountain village", "the harbour", "the weekly market", "the concert"],
    ["last week", "before lunch", "during the holidays", "after the rain stopped", "on Sunday", "yesterday evening"],
)
TRANSLATE = ["Translate into {lang}: {text}", "How do you say this in {lang}? \"{text}\"", "Translate this text to {lang}:\n\n{text}",
             "Please give me the {lang} version of this sentence: {text}"]
JSON_FORMS = [
    "Describe {subject} as a JSON object with the fields name, category, three facts (a list) and a rating from 1 to 5.",
    "Return only JSON: a list of three books or films about {subject}, each with title, year and a short reason.",
    "Create a JSON schedule for a one-day workshop on {subject}, with a list of sessions (time, title, speaker).",
    "Answer with a JSON object: the pros and cons of {subject}, each a list of strings.",
    "Make a YAML configuration for an app that tracks {subject}, with at least five settings.",
    "Output a CSV table with five rows about {subject}: name, value, unit.",
]
TOOLS = [("get_weather", "city (string), unit (celsius or fahrenheit)", "What is the weather in {city} tomorrow?"),
         ("book_table", "restaurant (string), date (YYYY-MM-DD), time (HH:MM), guests (integer)",
          "Book a table for {n} people at Luna on 2027-{month:02d}-{day:02d} at 19:30."),
         ("convert_currency", "amount (number), from (ISO code), to (ISO code)", "How much is {n}0 euros in US dollars?"),
         ("search_flights", "origin (string), destination (string), date (YYYY-MM-DD)",
          "Find a flight from {city} to Vienna on 2027-{month:02d}-{day:02d}."),
         ("add_reminder", "text (string), when (ISO date-time)", "Remind me to call {person} on 2027-{month:02d}-{day:02d} at 10:00.")]
CITIES = ["Porto", "Krakow", "Nairobi", "Osaka", "Quito", "Tallinn", "Hanoi", "Perth", "Montreal", "Accra", "Bergen", "Seville"]
FOREIGN_CHAT = [  # (language, requests)
    ("French", ["Peux-tu m'expliquer {subject} simplement ?", "Donne-moi trois conseils sur {subject}.",
                "J'aimerais écrire un petit texte sur {subject}. Peux-tu m'aider ?"]),
    ("Spanish", ["¿Puedes explicarme qué es {subject}?", "Dame tres consejos sobre {subject}, por favor.",
                 "Escribe un párrafo corto sobre {subject}."]),
    ("German", ["Kannst du mir {subject} einfach erklären?", "Gib mir drei Tipps zum Thema {subject}.",
                "Schreib einen kurzen Text über {subject}."]),
    ("Italian", ["Puoi spiegarmi {subject} in modo semplice?", "Dammi tre consigli su {subject}.",
                 "Scrivi un breve testo su {subject}."]),
    ("Portuguese", ["Podes explicar-me {subject} de forma simples?", "Dá-me três conselhos sobre {subject}.",
                    "Escreve um pequeno texto sobre {subject}."]),
]
DIALOGUE_FORMS = ["Write a short dialogue between {person} and {other} about {subject}.",
                  "Role-play: you are a shop assistant and I am a customer asking about {subject}. Start the conversation.",
                  "Write an interview with an expert on {subject}, five questions and answers.",
                  "Write a dialogue in which {person} teaches {other} about {subject}."]
SELF_INSTRUCT = ["Write one question that a curious student might ask about {subject}. Write only the question.",
                 "Write one task that someone could ask an assistant to do about {subject}. Write only the task.",
                 "Write a short math word problem about {subject}. Write only the problem.",
                 "Write a request for a piece of code related to {subject}. Write only the request."]
STYLES = ("chat", "multi-turn", "question", "code-write", "code-explain", "math", "summarise", "rewrite", "extract",
          "translate", "json", "dialogue", "self-instruct")


@dataclass(frozen=True)
class Job:
    id: str
    style: str
    first: list[dict]
    then: str | None = None
    then_mode: str = "embed"  # embed | follow

    def to_dict(self) -> dict:
        return asdict(self)


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _math_problem(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 40), rng.randint(2, 25), rng.randint(3, 90)
    person, other = rng.sample(PEOPLE, 2)
    plural, single = rng.choice(ITEMS)
    forms = [
        f"{person} buys {a} {plural} at {b} dollars each and pays with a {100 * (1 + a * b // 100)} dollar note. "
        f"How much change does {person} get?",
        f"{person} has {a + c} {plural} and gives {c} of them to {other}. Then {person} buys {b} more. "
        f"How many {plural} does {person} have now?",
        f"A {single} costs {b} euros. After a {rng.choice([10, 15, 20, 25, 30])}% discount, what does it cost? Explain each step.",
        f"Solve for y: {a}y - {b} = {a * c - b}. Show your steps.",
        f"A car drives {a * 10} km in {rng.choice([2, 3, 4, 5])} hours. "
        f"At the same speed, how far does it go in {rng.choice([6, 7, 8])} hours?",
        f"What is {rng.choice([5, 12, 35, 40, 65])}% of {c * 10}? Then subtract {b}. Show your work.",
        f"{person} and {other} share {a * 6} {plural} in the ratio 1:{rng.choice([2, 3, 5])}. How many does each get?",
        f"A rectangle is {a} metres long and {b} metres wide. What are its area and its perimeter?",
        f"Convert {c * 100} grams into kilograms, and {a} kilometres into metres.",
        f"{person} saves {b} dollars a week. How many weeks until {person} has {b * c} dollars?",
        f"Find x and y if x + y = {a + b} and x - y = {abs(a - b)}.",
        f"A tank holds {c * 20} litres and empties at {rng.choice([4, 5, 8, 10])} litres per minute. How long until it is empty?",
    ]
    return rng.choice(forms)


def _sentence(rng: random.Random) -> str:
    subject = rng.choice(SUBJECTS)
    parts = [rng.choice(options).format(subject=subject) for options in SENTENCE_PARTS]
    return " ".join(parts) + "."


def _job(index: int, style: str, rng: random.Random) -> Job:
    job_id = f"{style}-{index:05d}"
    subject, other_subject = rng.sample(SUBJECTS, 2)
    person, other = rng.sample(PEOPLE, 2)
    if style == "chat":
        return Job(job_id, style, _user(rng.choice(CHAT_FORMS).format(person=person, subject=subject)))
    if style == "multi-turn":
        first = rng.choice(QUESTION_FORMS + CHAT_FORMS).format(subject, other_subject, person=person, subject=subject)
        return Job(job_id, style, _user(first), rng.choice(FOLLOW_UPS), "follow")
    if style == "question":
        return Job(job_id, style, _user(rng.choice(QUESTION_FORMS).format(subject, other_subject)))
    if style == "code-write":
        lang = rng.choice(CODE_LANGUAGES)
        if rng.random() < 0.15:
            return Job(job_id, style, _user(f"Write an SQL query that {rng.choice(SQL_TASKS)}. Explain it briefly."))
        kind = rng.choice(["a function", "a short program", "a function with a docstring and an example", "a class"])
        return Job(job_id, style, _user(f"Write {kind} in {lang} that {rng.choice(CODE_TASKS)}."))
    if style == "code-explain":
        lang = rng.choice(CODE_LANGUAGES)
        return Job(job_id, style, _user(f"Write a {lang} function that {rng.choice(CODE_TASKS)}. Only the code."),
                   rng.choice(EXPLAIN_CODE))
    if style == "math":
        return Job(job_id, style, _user(_math_problem(rng)))
    if style in ("summarise", "rewrite", "extract"):
        follow = {"summarise": SUMMARISE, "rewrite": REWRITE, "extract": EXTRACT}[style]
        return Job(job_id, style, _user(rng.choice(DOCUMENT_FORMS).format(subject)), rng.choice(follow))
    if style == "translate":
        lang, draw = rng.choice(LANGUAGES[:5]), rng.random()
        if draw < 0.35:  # the target writes the text in English, then translates it
            return Job(job_id, style, _user(f"Write two sentences about {subject}."),
                       f"Translate this text to {lang}:\n\n{{answer}}")
        if draw < 0.55:  # ... or in another language, then translates it into English
            return Job(job_id, style, _user(f"Write two sentences in {lang} about {subject}."),
                       "Translate this text to English:\n\n{answer}")
        text = " ".join(_sentence(rng) for _ in range(rng.randint(1, 3)))
        return Job(job_id, style, _user(rng.choice(TRANSLATE).format(lang=lang, text=text)))
    if style == "json":
        if rng.random() < 0.4:
            name, args, request = rng.choice(TOOLS)
            system = (f"You can call the function {name}({args}). To call it, answer only with JSON: "
                      f'{{"name": "{name}", "arguments": {{...}}}}.')
            text = request.format(city=rng.choice(CITIES), n=rng.randint(2, 9), month=rng.randint(1, 12),
                                  day=rng.randint(1, 28), person=person)
            return Job(job_id, style, [{"role": "system", "content": system}, {"role": "user", "content": text}])
        return Job(job_id, style, _user(rng.choice(JSON_FORMS).format(subject=subject)))
    if style == "dialogue":
        if rng.random() < 0.5:
            _, requests = rng.choice(FOREIGN_CHAT)
            return Job(job_id, style, _user(rng.choice(requests).format(subject=subject)))
        return Job(job_id, style, _user(rng.choice(DIALOGUE_FORMS).format(person=person, other=other, subject=subject)))
    if style == "self-instruct":
        return Job(job_id, style, _user(rng.choice(SELF_INSTRUCT).format(subject=subject)), "{answer}")
    raise ValueError(f"unknown style {style!r}")


def compose_jobs(n: int, seed: int = 0) -> list[Job]:
    """n jobs, the styles in turn (so every shard holds every style), each composed from its own seeded draw."""
    return [_job(i, STYLES[i % len(STYLES)], random.Random(f"eagle-corpus:{seed}:{i}")) for i in range(n)]
