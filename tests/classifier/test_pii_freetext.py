"""Names, street addresses, dates of birth and ages in free text: the hard cases, both ways."""

from __future__ import annotations

import pytest

from kinference_common.detectors.core import Classifiers
from kinference_common.detectors.pii import findings


_ENGINES: dict[str, Classifiers] = {}


def _both(text: str) -> tuple[list[str], list[str]]:
    """The tag and findings with Hyperscan, checked equal to the ``re`` fallback's."""
    if not _ENGINES:
        _ENGINES.update(auto=Classifiers(engine="auto"), re=Classifiers(engine="re"))
    hs = _ENGINES["auto"].classify("pii", [text])
    rx = _ENGINES["re"].classify("pii", [text])
    assert hs.tags == rx.tags, text
    return hs.tags, hs.findings


CONFIRMED = [
    # the example: a name, a French address, a birth date
    ("Hi, I'm Maria Gonzalez, 14 Rue des Lilas, Lyon, born 03/07/1985, and my claim was refused", "person"),
    ("My name is José Álvarez and I need help with a letter.", "person"),
    ("Mein Name ist Jürgen Weiß.", "person"),
    ("Je m'appelle Thérèse.", "person"),
    ("Dear Mrs. O'Brien,\nthank you for the quick reply.", "person"),
    ("Hallo Herr Müller,\nanbei die Unterlagen.", "person"),
    ("Please fix the tone.\n\nBest regards,\nLena Vogel", "person"),
    ("Name: Bernard\nPlan: premium", "person"),
    ("Send it to 221B Baker Street, London NW1 6XE.", "address"),
    ("Ich wohne in der Hauptstraße 12, 10115 Berlin.", "address"),
    ("Il mio indirizzo è Via Roma 12, 20121 Milano.", "address"),
    ("Calle de Alcalá, 45, 28014 Madrid", "address"),
    ("We live at Kerkstraat 12a in Utrecht.", "address"),
    ("Deliver to Marta-Fritsch-Gasse 3-2, 43246 Bad Brückenau", "address"),
    # street types the first rules lacked, in every order (each missed before)
    ("Abito in Stretto Elena, 0, 63069 Marcelli", "address"),
    ("Deliver to\nRotonda Bertoni, 961 Piano 6, 54016 Sciglio", "address"),
    ("La consegna va a Borgo Bruno, 68.", "address"),
    ("Mi dirección: Vial Josefa Rubio 689, Teruel", "address"),
    ("Envíelo a C. de Débora Melero 42.", "address"),
    ("Moro na R. Magalhães, S/N", "address"),
    ("Envie para Av Nair Soares, 25", "address"),
    ("We wonen op Meganboulevard 15, 6293JQ Beerzerveld", "address"),
    ("Ik woon op de Dinabaan 54 sinds mei.", "address"),
    ("Address: rue de Rousset", "address"),
    ("I live at rue Coulon, 67538 Jacquot.", "address"),
    ("I live at 93938 Duncan Centers Suite 233.", "address"),
    ("Mieszkam przy ul. Władysława Łokietka 95/96, 13-405 Goleniów", "address"),
    ("Ich wohne am Kaiserring 12.", "address"),
    ("Au 3 place de la Concorde, Paris", "address"),
    ("Au 3 Place Vendôme, 75001 Paris", "address"),
    ("DOB: 1985-07-03, policy 55", "dob"),
    ("Geburtsdatum: 03.07.1985", "dob"),
    ("my son was born on 4 March 2019 and has a fever", "dob"),
    # a verb between the label and the date (each missed before)
    ("my date of birth is 03/07/1985", "dob"),
    ("my date of birth is 1985-07-03", "dob"),
    ("his date of birth is 3 July 1985", "dob"),
    ("date of birth = 1985-07-03", "dob"),
    ("my birthday is 03/07/1985", "dob"),
    ("Maria's birthday was on 3 July 1985", "dob"),
    # a form written as JSON or a Python dict (each missed before)
    ('{"full name": "Maria Gonzalez"}', "person"),
    ('{"full_name": "Maria Gonzalez, PhD", "plan": "gold"}', "person"),
    ("{'patient': 'Maria Gonzalez'}", "person"),
    ('{"dob": "1985-07-03"}', "dob"),
    ('{"date_of_birth": "1985-07-03"}', "dob"),
    ('{"dateOfBirth": "03/07/1985"}', "dob"),
]


@pytest.mark.parametrize(("text", "kind"), CONFIRMED)
def test_free_text_personal_data_is_confirmed(text: str, kind: str) -> None:
    tags, found = _both(text)
    assert tags == ["pii-confirmed"]
    assert found == [kind] or kind in {f[0] for f in findings(text) if f[4]}


@pytest.mark.parametrize("text", ["I'm 34 years old and my knee hurts.", "Age: 71", "J'ai 34 ans."])
def test_an_age_alone_is_unknown(text: str) -> None:
    assert _both(text) == (["pii-unknown"], ["age"])


CLEAN = [
    "Find flights from Paris to Rome on 12 May for 2 adults.",
    "I'm flying to Lisbon in June; then Porto.",
    "Napoleon Bonaparte was born in 1769. Why is he still famous?",
    "Albert Einstein was born on 14 March 1879; summarise his early years.",
    "When did Dr. Martin Luther King give the speech?",
    "I'm using Visual Studio Code and it crashes on startup.",
    "This is Adobe Photoshop, right? What does the free tier include?",
    "Dear Nintendo Switch support team: the installer fails with error 910.",
    "Hello World!",
    "jobs:\n  build:\n    name: Build and Test\n    steps:\n      - name: Run Tests\n",
    "class UserProfile:\n    first_name: str\n    street_address: str\n",
    "SELECT first_name, date_of_birth FROM customers WHERE age > 30;",
    "The invoice dated 03/07/1985 is still unpaid.",
    "Version 4.2 was released on 5 May 2023.",
    "Hotels near 5th Avenue? Budget 150 euros, 4 nights.",
    "Take Route 66 for 3 days; the 3 lanes merge at exit 12.",
    "A 34-year-old man was elected in 1961.",
    "Picture feel clear Mrs. Too catch eye white however.",
    # numbers before capitalised words that are no street
    "Top 10 Scenic Views.",
    "I saw 3 Great Lakes.",
    "Windows 10, 20000 Users were affected.",
    "Python 3, 10000 Lines of code to port.",
    "Read Chapter 3, 1200 Soldiers died.",
    "Grand Theft Auto 5, 2013 Rockstar",
    "Plaza Hotel 5 stars, near the station.",
    "Via Appia 2 was built by Appius Claudius.",
    "sent via Route 9 to the depot",
    "Monitoring 2 nodes and Rendering 3 frames",
    "Spring 2023 release notes; String 3 chars",
    "Open Notepad 2 times",
    "Er wurde Platz 2 im Finale.",
    "bind to ::1 Property court room professional case",
    "if name is None:\n    raise ValueError('name is Required')",
    "Order 3 Place Settings today; we need 2 square meters of fabric.",
    "Studio 54 Disco Club",
    "Formula 1 Grand Prix Circuit",
    "The 3 Musketeers Trail",
    # a birthday that is no one's, JSON that names no one
    "the shop's birthday is 03/07/1985",
    "the birthday party is on 03/07/2024",
    '{"name": "get_weather", "description": "Get the weather"}',
    '{"name": "Maria Gonzalez is here"}',
    # a quoted name, customer or client: products and companies as often as people (a review: 86% of product JSON)
    '[{"name": "Blue Widget", "price": 9.99}, {"name": "Red Gadget", "price": 5}]',
    "{'customer': 'Acme Corp', 'client': 'Globex Inc'}",
    '{"name": "Maria Gonzalez"}',
    '{"created": "1985-07-03", "name": "release"}',
]


@pytest.mark.parametrize("text", CLEAN)
def test_what_is_not_personal_data_stays_none(text: str) -> None:
    assert _both(text)[0] == ["pii-none"]


def test_findings_name_the_rule_never_the_text() -> None:
    text = "Dear Maria,\nI live at 14 Rue des Lilas."
    found = {(entity, rule) for entity, rule, _s, _e, verdict in findings(text) if verdict}
    assert ("person", "person_salutation") in found
    assert ("address", "address_number_first") in found


def test_every_street_type_the_rules_know_is_found_by_the_scan() -> None:
    """The cue is built from the validator's own lists: a type known to one is never missed by
    the other (main's cue lacked `Contrada`, `Strada`, `Borgo`... that its validator knew)."""
    from kinference_common.detectors import freetext

    c = _ENGINES.get("auto") or Classifiers(engine="auto")
    missed = []
    for street_type in sorted(freetext._TYPES_BEFORE):
        word = street_type.capitalize()
        text = f"Spedire a {word} Garibaldi 12, per favore."
        if c.classify("pii", [text]).tags != ["pii-confirmed"]:
            missed.append(word)
    for street_type in sorted(freetext._TYPES_AFTER_NUMBER):
        text = f"Envoyez-le au 14 {street_type} des Roses, merci."
        if c.classify("pii", [text]).tags != ["pii-confirmed"]:
            missed.append(street_type)
    assert missed == []


def test_free_text_cues_are_bounded_and_need_what_starts_a_name() -> None:
    """Cheap on clean text: no cue needs Hyperscan's start-of-match tracking, and the person
    cues do not fire where no capital follows, so Python judges nothing there."""
    from kinference_common.detectors import freetext
    from kinference_common.detectors.patterns import build_scanner

    assert [p.name for _e, _r, p, _v in freetext.CUES if p.max_width is None] == []
    scanner = build_scanner([p for _e, _r, p, _v in freetext.CUES], "auto")
    names = [p.name for _e, _r, p, _v in freetext.CUES]
    text = "i'm using it. this is fine. hi all, dear team. name: build. best wishes to you. born and raised."
    fired = {names[i] for i in scanner.scan(text).fired()}
    assert fired.isdisjoint({"person_weak", "person_intro", "person_salutation", "person_field",
                             "person_signature", "dob_born"}), fired
