#!/usr/bin/env python3
"""The writer's row groups in `gpusort sort --timeline` logs: per log, the medians of a row
group's encoding, of "encoded" to "ready" (its pages compressed) and of "ready" to "appended"
(waiting for the row groups before it), the times of the first sorted batch, the last range
and the written output, and the cores busy (CPU seconds over wall seconds) up to the last range
and after it.

    python3 scripts/timeline_row_groups.py ab-logs/*.log
"""
import re,sys
for f in sys.argv[1:]:
    ev={}; rng=[]; cpu_at={}
    for line in open(f):
        m=re.match(r'\[\s*([\d.]+) s, cpu\s+([\d.]+)',line)
        if not m: continue
        t=float(m.group(1)); cpu=float(m.group(2))
        m2=re.search(r'writer: row group (\d+) (encoding|encoded|ready|appended)',line)
        if m2: ev.setdefault(int(m2.group(1)),{})[m2.group(2)]=t
        if 'first sorted batch' in line: cpu_at['first']=(t,cpu)
        if 'last range handed out' in line: cpu_at['last']=(t,cpu)
        if 'output written' in line: cpu_at['written']=(t,cpu)
    import statistics as st
    enc=[(e['encoded']-e['encoding'])*1000 for e in ev.values() if 'encoded' in e and 'encoding' in e]
    rdy=[(e['ready']-e['encoded'])*1000 for e in ev.values() if 'ready' in e and 'encoded' in e]
    app=[(e['appended']-e['ready'])*1000 for e in ev.values() if 'ready' in e and 'appended' in e]
    (t0,c0),(t1,c1),(t2,c2)=cpu_at['first'],cpu_at['last'],cpu_at['written']
    print(f.split('/')[-1], "enc med %.0f ready med %.0f max %.0f append-wait med %.0f | first %.2f last %.2f written %.2f | cores %.1f (to last) %.1f (tail)"%(st.median(enc),st.median(rdy),max(rdy),st.median(app),t0,t1,t2,(c1-c0)/(t1-t0),(c2-c1)/(t2-t1)))
