"""Writes made-up stand-ins, in their formats, for RULER's essay JSON text, SQuAD v2.0 dev and
HotpotQA dev distractor (synthetic_essays.txt, synthetic_squad.json, synthetic_hotpotqa.json):
deterministic (random.Random(0)), with abbreviations, decimals, ellipses, duplicate paragraphs
and unanswerable questions, to exercise the essay and QA code paths without the real texts.
Usage: python make_stand_ins.py OUT_DIR
"""
import json
import pathlib
import random
import sys

NOUNS = ('river stone lamp garden window harbor engine ladder violin meadow candle bridge '
         'orchard kettle compass lantern').split()
VERBS = 'carries watches builds follows paints repairs counts opens measures gathers'.split()
ADJS = 'quiet bright narrow ancient hollow gentle crooked silver patient distant'.split()
NAMES = ['Dr. Alder', 'Mr. Brook', 'Mrs. Cole', 'Prof. Dane', 'St. Ives', 'Ms. Fern']


def main(out: pathlib.Path):
  r = random.Random(0)

  def sentence():
    subject = r.choice(NAMES) if r.random() < .2 else 'The ' + r.choice(ADJS)
    s = f'{subject} {r.choice(NOUNS)} {r.choice(VERBS)} the {r.choice(ADJS)} {r.choice(NOUNS)}'
    if r.random() < .3:
      s += f', e.g. near the {r.choice(NOUNS)} at {r.randint(1, 99)}.{r.randint(0, 9)} km'
    return s + r.choice(['.', '.', '.', '?', '!', '...'])

  def paragraph(n):
    return ' '.join(sentence() for _ in range(n))

  out.mkdir(parents=True, exist_ok=True)
  essay = ''
  for i in range(6):
    paragraphs = '\n\n'.join(paragraph(r.randint(3, 8)) for _ in range(12))
    essay += f'Essay {i + 1}\n\n' + paragraphs + ('\n' if i % 2 else '')
  (out / 'synthetic_essays.txt').write_text(essay)

  squad = {'version': 'v2.0', 'data': []}
  for a in range(6):
    paras = []
    for p in range(r.randint(2, 6)):
      ctx = paragraph(r.randint(2, 5))
      qas = []
      for q in range(r.randint(1, 3)):
        word = r.choice(ctx.split())
        impossible = r.random() < .25
        answers = [] if impossible else [
            {'text': word, 'answer_start': ctx.index(word)},
            {'text': word.strip('.,?!'), 'answer_start': ctx.index(word)}]
        qas.append({'question': f'Which word follows question {a}.{p}.{q} about the '
                                f'{r.choice(NOUNS)}?',
                    'id': f'q{a}{p}{q}', 'answers': answers, 'is_impossible': impossible})
      paras.append({'qas': qas, 'context': ctx})
    if a == 2:
      paras.append(dict(paras[0]))  # a paragraph twice, as in real dumps
    squad['data'].append({'title': f'Article_{a}', 'paragraphs': paras})
  (out / 'synthetic_squad.json').write_text(json.dumps(squad, indent=1))

  titles = [f'{r.choice(ADJS).title()} {r.choice(NOUNS).title()} {i}' for i in range(40)]
  hotpot = []
  for q in range(12):
    chosen = r.sample(titles, 10)
    ctx = [[t, [sentence() + ' ' for _ in range(r.randint(1, 4))]] for t in chosen]
    hotpot.append({'_id': f'h{q}', 'question': f'What links {chosen[0]} and {chosen[1]}?',
                   'answer': r.choice(NOUNS), 'supporting_facts': [[chosen[0], 0]],
                   'context': ctx, 'type': 'bridge', 'level': 'easy'})
  (out / 'synthetic_hotpotqa.json').write_text(json.dumps(hotpot, indent=1))


if __name__ == '__main__':
  main(pathlib.Path(sys.argv[1]))
