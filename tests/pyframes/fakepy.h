/* fakepy.h - a fake CPython (tests/pyframes/fakepy.c) for the guard tests in
 * tests/unit/test_pyframes.c: the symbols pyframes.c looks for, type objects,
 * _PyRuntime and a thread state with a frame chain, laid out as 3.10, 3.12
 * or 3.13 would, or wrong on purpose. Built twice: libpython-fake.so (3.11+
 * symbols: Py_Version, Py_IsFinalizing) and libpython-fake310.so (3.10's:
 * Py_GetVersion only, _Py_IsFinalizing). Every object sits on its own page,
 * so a test can unmap one. */
#ifndef GG_FAKEPY_H
#define GG_FAKEPY_H

enum fakepy_scenario {
    FAKE_312,             /* inner Net.forward (line 13), outer <module> (line 21) */
    FAKE_313,             /* the same, 3.13 layout and offsets table */
    FAKE_310,             /* the same, 3.10 frame objects (libpython-fake310.so) */
    FAKE_314,             /* Py_Version 3.14.0 */
    FAKE_39,              /* Py_GetVersion "3.9.18" (libpython-fake310.so) */
    FAKE_PRERELEASE,      /* 3.12.0rc1 */
    FAKE_CODE_SIZE,       /* PyCode_Type.tp_basicsize not 3.12's */
    FAKE_TP_NAME_BAD,     /* PyCode_Type.tp_name points at nothing mapped */
    FAKE_313_COOKIE,      /* _Py_DebugOffsets cookie wrong */
    FAKE_313_FREE_THREADED,
    FAKE_313_OFFSETS,     /* an offset outside its structure */
    FAKE_UNMAPPED_FRAME,  /* the outer frame's page unmapped */
    FAKE_CYCLE,           /* outer.previous = inner */
    FAKE_MISALIGNED,      /* inner.previous 4 bytes off */
    FAKE_NOT_CODE,        /* inner frame's code is a str */
    FAKE_BAD_INSTR,       /* inner frame's instruction outside its code */
    FAKE_BAD_OWNER,       /* inner frame's owner 9 */
    FAKE_BAD_STR,         /* inner code's filename is a bytes object */
};

/* Build the scenario; 0 on success. */
int fakepy_setup(int scenario);
/* Turn Py_IsFinalizing on or off; give threads no thread state. */
void fakepy_finalizing_on(void);
void fakepy_finalizing_off(void);
void fakepy_no_tstate(void);
/* Unmap the inner code object; give it another name object (as if another
 * code object now lived at its address). */
void fakepy_free_inner_code(void);
void fakepy_rename_inner_code(void);
/* Point the inner frame's link 4 bytes off, after the first walk. */
void fakepy_misalign_inner(void);

#endif /* GG_FAKEPY_H */
