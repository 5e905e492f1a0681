import sys, collections
d = collections.defaultdict(lambda: collections.defaultdict(list))
order = []
for f in sys.argv[1:]:
    for l in open(f):
        r, c, dt, rec, ms = l.split()
        d[(dt, rec)][c].append(float(ms))
        if c not in order: order.append(c)
recs = ['copy', 'loss_and_grad/fused', 'forward/fused/recompute', 'backward/fused/recompute', 'loss_and_grad/fused/probs', 'loss_and_grad/fused/in_place']
print('%-9s %-28s' % ('dtype', 'record') + ''.join('%15s' % c for c in order))
for dt in ['float32', 'bfloat16', 'float16']:
    for rec in recs:
        v = d[(dt, rec)]
        print('%-9s %-28s' % (dt, rec) + ''.join('%15.2f' % min(v[c]) if v[c] else '%15s' % '-' for c in order))
