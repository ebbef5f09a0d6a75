;;; magent-store-magent.el --- The adapter between magent and magent-store  -*- lexical-binding: t; -*-

;; Copyright (C) 2026 The magent-store authors
;; SPDX-License-Identifier: GPL-3.0-or-later

;; Author: Seed 2a926889 maintainers <maintainers@users.noreply.a-seed-2a926889.example>
;; Maintainer: Seed 2a926889 maintainers <maintainers@users.noreply.a-seed-2a926889.example>
;; Keywords: tools, convenience
;; URL: https://github.com/jamie-cui/magent

;; This file is not part of GNU Emacs.

;; This program is free software: you can redistribute it and/or modify
;; it under the terms of the GNU General Public License as published by
;; the Free Software Foundation, either version 3 of the License, or
;; (at your option) any later version.

;; This program is distributed in the hope that it will be useful,
;; but WITHOUT ANY WARRANTY; without even the implied warranty of
;; MERCHANTABILITY or FITNESS FOR A PARTICULAR PURPOSE.  See the
;; GNU General Public License for more details.

;; You should have received a copy of the GNU General Public License
;; along with this program.  If not, see <https://www.gnu.org/licenses/>.

;;; Commentary:

;; Everything that knows magent's internals lives here: which of magent's
;; functions `magent-store-mode' advises or calls, and how (one table,
;; `magent-store-magent-functions', checked when the mode turns on); how
;; a session's header and its thread's initial state are built from
;; magent's own objects; how values are encoded the way magent's writer
;; encodes them; and how magent's read side is answered from the store
;; (for magent's schema-6 release, with writing back for it, in
;; magent-store-magent-schema6.el).
;; The shim core (magent-store.el) knows only sessions, events, chunks
;; and flushes.
;;
;; Nothing here may signal into magent's own call: every advice body is
;; guarded, and what fails is logged once and shown by
;; `magent-store-status'.

;;; Change Log:

;; 0.1.0: first release.

;;; Code:

(require 'cl-lib)
(require 'map)
(require 'subr-x)
(require 'magent-store)
(require 'magent-store-json)
(require 'magent-store-idle)
(require 'magent-store-layout)

;; Magent's schema-6 read side and writing back for its release live in
;; magent-store-magent-schema6.el, loaded at the end of this file.
(defvar magent-store-magent--exported)
(declare-function magent-store-magent--schema "magent-store-magent-schema6")
(declare-function magent-store-magent--flush-pending "magent-store-magent-schema6")
(declare-function magent-store-magent--offer-export "magent-store-magent-schema6")

;;;; The magent functions this file touches

(defconst magent-store-magent-functions
  '(;; Write side.
    (magent-thread-append-event
     :around magent-store-magent--around-append-event required "0.1 (schema 6, 7)"
     "each journal event is queued for the backend")
    (magent-thread-append-item-content
     :after magent-store-magent--after-append-item-content required "0.1 (schema 6, 7)"
     "each streamed chunk is queued, with magent's own time")
    (magent-session-save-deferred-for-session
     :around magent-store-magent--around-save-deferred required "0.1 (schema 6, 7)"
     "a deferred save becomes a header refresh and a flush request")
    (magent-session-save-for-session
     :around magent-store-magent--around-save required "0.1 (schema 6, 7)"
     "a save becomes a header refresh and a flush that waits")
    (magent-session-clear
     :around magent-store-magent--around-clear optional "0.1 (schema 6, 7)"
     "a session magent clears is removed from the store too (else it stays \
in the store)")
    (magent-thread-session-id call nil required "0.1 (schema 6, 7)"
     "which session a thread belongs to")
    (magent-thread-scope call nil required "0.1 (schema 6, 7)"
     "where a thread's session lives")
    (magent-thread-item-id call nil required "0.1 (schema 6, 7)"
     "which item a chunk belongs to")
    (magent-thread-event-to-alist call nil required "0.1 (schema 6, 7)"
     "an event in magent's own shape")
    (magent-session-thread-ledger call nil required "0.1 (schema 6, 7)"
     "a session's thread")
    (magent-session-get-id call nil required "0.1 (schema 6, 7)"
     "a session's id")
    (magent-thread-turns call nil required "0.1 (schema 6, 7)"
     "whether magent would write a session at all (turns or jobs)")
    (magent-session-metadata call nil required "0.1 (schema 6, 7)"
     "the header's kind, action, status, title, parent and metadata")
    (magent-session-agent-jobs call nil required "0.1 (schema 6, 7)"
     "the header's agent-jobs")
    (magent-session-approval-overrides call nil required "0.1 (schema 6, 7)"
     "the header's approval-overrides")
    (magent-thread-item-updated-at call nil optional "0.1 (schema 6, 7)"
     "a chunk's time exactly as magent recorded it (else a chunk's time is \
the clock's)")
    (magent-thread-snapshot-to-alist call nil optional "0.1 (schema 6, 7)"
     "a thread's initial state, which no event carries (else a thread's \
creation time and metadata are not kept)")
    (magent-json-safe-value call nil optional "0.1 (schema 6, 7)"
     "values encoded as magent encodes them (else values are encoded by \
magent-store, as magent encodes them)")
    (magent-session--header-data-for-session call nil optional "schema 7"
     "magent's own header (else headers are built by magent-store, as \
magent builds them)")
    (magent-session-summary-title call nil optional "0.1 (schema 6, 7)"
     "the header's summary-title, by magent's own rule (else headers have \
no summary title)")
    (magent-agent-job-to-alist call nil optional "0.1 (schema 6, 7)"
     "the header's agent-jobs (else headers list no agent jobs)")
    ;; Read side.
    (magent-session-read-file
     :around magent-store-magent--around-read-file optional "0.1 (schema 6, 7)"
     "a session is flushed, then read by magent (rendered for schema 6)")
    (magent-session--read-file-metadata
     :around magent-store-magent--around-read-file-metadata optional
     "0.1 (schema 6, 7)"
     "the picker's metadata of a session (rendered for schema 6)")
    (magent-session--file-display-time
     :around magent-store-magent--around-file-display-time optional
     "0.1 (schema 6, 7)"
     "the picker sorts a session by its last flush, not its last header")
    (magent-session-list-files
     :around magent-store-magent--around-list-files optional "0.1 (schema 6, 7)"
     "every session is flushed before magent lists them, and listed by one \
backend call (rendered for schema 6)")
    (magent-session-list-files-for-scope
     :around magent-store-magent--around-list-scope optional "0.1 (schema 6, 7)"
     "every session is flushed before magent lists a scope, and listed by \
one backend call (rendered for schema 6)")
    (magent-session--read-file-metadata-cached
     :around magent-store-magent--around-metadata-cached optional "0.1 (schema 6, 7)"
     "a listing looks each session's metadata up once, not at every \
comparison of its sort")
    (magent-session-list-action-files
     :around magent-store-magent--around-list optional "0.1 (schema 6, 7)"
     "every session is flushed before magent lists action sessions")
    ;; The listing's metadata, built with magent's own functions.
    (magent-session--scope-storage-directory call nil optional
     "0.1 (schema 6, 7)"
     "a scope's sessions are listed by one backend call (else magent reads \
each of them)")
    (magent-session-validate-id call nil optional "0.1 (schema 6, 7)"
     "the listing's metadata is built from the backend's listing (else \
magent reads each session)")
    (magent-session--clean-summary-title call nil optional "0.1 (schema 6, 7)"
     "the listing's summary titles, by magent's own rule (else magent reads \
each session)")
    (magent-session--normalize-project-root call nil optional
     "0.1 (schema 6, 7)"
     "the listing's project roots, in magent's form (else magent reads each \
session)")
    (magent-session--approval-override-from-alist call nil optional
     "0.1 (schema 6, 7)"
     "the listing's approval overrides are checked as magent checks them \
\(else magent reads each session)")
    (magent-agent-job-from-alist call nil optional "0.1 (schema 6, 7)"
     "the listing's agent jobs are checked as magent checks them (else \
magent reads each session)")
    (magent-session-id call nil optional "0.1 (schema 6, 7)"
     "which session magent clears (else a cleared session stays in the \
store)")
    ;; Opening a session found by `magent-store-search'.
    (magent-runtime-load-session-file call nil when-used "0.1 (schema 6, 7)"
     "RET on a search result resumes its session in magent, as magent's own \
session/load does (else a read-only transcript)")
    (magent-runtime-session-from-id call nil when-used "0.1 (schema 6, 7)"
     "RET on a session magent already holds shows it, never loads it twice")
    (magent-agent-shell--buffers call nil when-used "0.1 (schema 6, 7)"
     "RET shows magent's own buffer of a session (else its transcript)")
    (magent-agent-shell--magent-buffer-p call nil when-used "0.1 (schema 6, 7)"
     "M-x magent-store-export-session in magent's buffer exports its \
session (else it asks which session)")
    (magent-runtime-session-magent-session call nil when-used
     "0.1 (schema 6, 7)"
     "RET finds the session object of a session magent's runtime holds \
\(else it looks among magent's scoped sessions)")
    ;; Lifecycle timing (magent-store-timing.el), while the mode and
    ;; `magent-store-timing-enabled' are on: that file adds its own advice
    ;; and sink, once magent's modules are loaded.
    (magent-agent-loop-apply-event
     :before magent-store-timing--before-apply-event when-used
     "0.1 (schema 6, 7)"
     "the first provider event of each request and the reasoning spans are \
timed (else they are not)")
    (magent-agent-loop-event-context call nil when-used "0.1 (schema 6, 7)"
     "which turn a provider event belongs to")
    (magent-llm-event-type call nil when-used "0.1 (schema 6, 7)"
     "whether a provider event starts or ends reasoning")
    (magent-lifecycle-events-add-sink call nil when-used "0.1 (schema 6, 7)"
     "turns, requests, tool calls and subagents are timed (else they are not)")
    (magent-lifecycle-events-remove-sink call nil when-used "0.1 (schema 6, 7)"
     "timing stops when the mode or timing is turned off")
    (magent-lifecycle-events-context-turn-id call nil when-used
     "0.1 (schema 6, 7)"
     "which turn a lifecycle event belongs to")
    (magent-lifecycle-events-context-subagent-id call nil when-used
     "0.1 (schema 6, 7)"
     "which subagent a lifecycle event belongs to"))
  "Every magent function `magent-store-mode' touches.
Each row is (FUNCTION HOW HANDLER NEED MAGENT WHY): HOW is an advice
combinator (HANDLER is then the advice) or `call'; NEED is `required'
\(without it the mode cannot route what the row says), `optional' (a
fallback is used) or `when-used' (looked up when it is used, not when
the mode turns on: it lives in a module magent loads after its session
module; a fallback is used); MAGENT names the magent releases and
session schemas the row was written for; WHY says what the row is for.
Checked when the mode turns on: the mode says once what the loaded
magent lacks, and advises only functions that exist.  An advice of a
`when-used' row is added by the file that uses it (magent-store-timing),
not by the mode.")

(defvar magent-store-mode)

(defvar magent-store-magent--missing nil
  "Rows of `magent-store-magent-functions' the loaded magent lacks.")

(defvar magent-store-magent--reported 'never
  "The missing functions last reported, so that each report is said once.")

(defun magent-store-magent--role (row)
  "Return what ROW of `magent-store-magent-functions' is for, in user words."
  (string-trim (replace-regexp-in-string " *(else .*\\'" "" (nth 5 row))))

(defun magent-store-magent--fallback (row)
  "Return what is done when the loaded magent lacks ROW's function."
  (if (string-match "(else \\(\\(?:.\\|\n\\)*\\))\\'" (nth 5 row))
      (match-string 1 (nth 5 row))
    (format "not done: %s" (magent-store-magent--role row))))

(defun magent-store-magent--check ()
  "Return the rows whose function the loaded magent lacks.
What only has a fallback is shown by `magent-store-status'; what the
mode cannot do without is said once for each set of such gaps."
  (let* ((missing (cl-remove-if (lambda (row) (or (fboundp (car row))
                                                  (eq (nth 3 row) 'when-used)))
                                magent-store-magent-functions))
         (required (cl-remove-if-not (lambda (row) (eq (nth 3 row) 'required))
                                     missing)))
    (setq magent-store-magent--missing missing)
    (unless (equal (mapcar #'car required) magent-store-magent--reported)
      (setq magent-store-magent--reported (mapcar #'car required))
      (when required
        (message "magent-store-mode: this magent is missing what the mode \
needs for: %s; that is left to magent (M-x magent-store-status)"
                 (mapconcat #'magent-store-magent--role required "; "))))
    missing))

(defun magent-store-magent--view ()
  "Return, in user words, the mode's view of the loaded magent."
  (if (not (featurep 'magent-session))
      "not loaded yet (the mode starts routing when it is)"
    (concat
     (pcase (magent-store-magent--schema)
       (6 "magent's current release (sessions in schema 6: the store's are \
rendered for it to read)")
       (7 "a magent that reads the store's sessions (schema 7) itself")
       (schema (format "a magent with sessions in schema %s" schema)))
     (mapconcat (lambda (row)
                  (concat ";\n                    "
                          (magent-store-magent--fallback row)))
                magent-store-magent--missing ""))))

(defun magent-store-magent--install ()
  "Advise the magent functions of the table that exist."
  (when magent-store-mode
    ;; Before magent's session module is loaded, everything would be
    ;; missing: the mode installs again once it is.
    (when (featurep 'magent-session)
      (magent-store-magent--check))
    (dolist (row magent-store-magent-functions)
      (when (and (keywordp (nth 1 row)) (not (eq (nth 3 row) 'when-used))
                 (fboundp (nth 0 row)))
        (advice-add (nth 0 row) (nth 1 row) (nth 2 row))))))

(defun magent-store-magent--uninstall ()
  "Remove every advice of the table."
  (dolist (row magent-store-magent-functions)
    (when (and (keywordp (nth 1 row)) (not (eq (nth 3 row) 'when-used)))
      (advice-remove (nth 0 row) (nth 2 row)))))

;;;; Failures that must not reach magent

(defvar magent-store-magent--unencodable nil
  "Values JSON cannot hold, as (WHAT COUNT STORED-AS) rows.")

(defvar magent-store-magent--adapter-failures nil
  "What failed inside an advice: ((WHERE . CONDITION) COUNT MESSAGE) rows.")

(defun magent-store-magent--failed (where err)
  "Record that WHERE failed with ERR; tell the user the first time.
Not when it is why persistence stopped, which the user was told."
  (let* ((key (cons where (car-safe err)))
         (row (assoc key magent-store-magent--adapter-failures))
         (text (error-message-string err)))
    (cond (row (setcar (cdr row) (1+ (cadr row))))
          ((progn (push (list key 1 text) magent-store-magent--adapter-failures)
                  (and magent-store-gave-up magent-store-last-error
                       (string-search text magent-store-last-error))))
          (t (setq magent-store-last-error (format "%s: %s" where text))
             (message "magent-store: %s failed (%s); magent goes on, \
see M-x magent-store-status" where text)))))

(defmacro magent-store-magent--guarded (where &rest body)
  "Run BODY; an error in it is recorded under WHERE, never signalled."
  (declare (indent 1) (debug t))
  `(condition-case err
       (progn ,@body)
     (error (magent-store-magent--failed ,where err) nil)))

(defun magent-store-magent--adapter-status ()
  "Return the adapter's lines for `magent-store-status'."
  (concat
   (format "Magent:             %s\n" (magent-store-magent--view))
   (mapconcat (lambda (row)
                (format "Adapter:            %s, %d time%s: %s\n"
                        (car (car row)) (nth 1 row)
                        (if (= (nth 1 row) 1) "" "s") (nth 2 row)))
              (reverse magent-store-magent--adapter-failures) "")
   (mapconcat (lambda (row)
                (format "Not JSON:           %s, %d time%s, stored as %s\n"
                        (car row) (nth 1 row) (if (= (nth 1 row) 1) "" "s")
                        (nth 2 row)))
              (reverse magent-store-magent--unencodable) "")))

(add-hook 'magent-store-status-functions #'magent-store-magent--adapter-status)

;;;; Write side: events, chunks and saves

(declare-function magent-store-find-prepare "magent-store-find" (&optional root))
(declare-function magent-thread-session-id "ext:magent-ledger" (thread))
(declare-function magent-thread-scope "ext:magent-ledger" (thread))
(declare-function magent-thread-item-id "ext:magent-ledger" (item))
(declare-function magent-thread-item-updated-at "ext:magent-ledger" (item))
(declare-function magent-thread-turns "ext:magent-ledger" (thread))
(declare-function magent-thread-event-to-alist "ext:magent-ledger" (event))
(declare-function magent-thread-snapshot-to-alist "ext:magent-ledger" (thread))
(declare-function magent-json-safe-value "ext:magent-json" (value))
(declare-function magent-agent-job-to-alist "ext:magent-agent-job" (job))
(declare-function magent-session-get-id "ext:magent-session" (session))
(declare-function magent-session-thread-ledger "ext:magent-session" (session))
(declare-function magent-session-metadata "ext:magent-session" (session))
(declare-function magent-session-agent-jobs "ext:magent-session" (session))
(declare-function magent-session-approval-overrides "ext:magent-session"
                  (session))
(declare-function magent-session-summary-title "ext:magent-session" (session))

;;;;; Encoding values the way magent's writer does

(defun magent-store-magent--safe-value (value)
  "Return VALUE in the shapes `json-serialize' accepts, as magent does it.
magent's own `magent-json-safe-value' when the loaded magent has it;
otherwise the same mapping: nil is null, a symbol its name (a keyword
without its colon), a keyword plist an object, an alist an object, any
other list an array, anything else its printed form."
  (if (fboundp 'magent-json-safe-value)
      (magent-json-safe-value value)
    (magent-store-magent--safe-value-1 value)))

(defun magent-store-magent--plist-p (value)
  "Return non-nil when VALUE is a proper list of keyword/value pairs."
  (and (listp value)
       (let ((tail value))
         (while (and (consp tail) (keywordp (car tail)) (consp (cdr tail)))
           (setq tail (cddr tail)))
         (null tail))))

(defun magent-store-magent--alist-p (value)
  "Return non-nil when VALUE is a non-empty proper list of non-keyword pairs."
  (and (consp value)
       (proper-list-p value)
       (cl-every (lambda (entry)
                   (and (consp entry) (not (keywordp (car entry)))))
                 value)))

(defun magent-store-magent--key (key)
  "Return KEY, an alist or plist key, as the symbol of its JSON name."
  (cond ((keywordp key) (intern (substring (symbol-name key) 1)))
        ((symbolp key) key)
        ((stringp key) (intern key))
        (t (intern (format "%s" key)))))

(defun magent-store-magent--safe-value-1 (value)
  "Return VALUE made encodable (see `magent-store-magent--safe-value')."
  (cond
   ((null value) :null)
   ((or (stringp value) (numberp value) (memq value '(t :json-false :null)))
    value)
   ((keywordp value) (substring (symbol-name value) 1))
   ((symbolp value) (symbol-name value))
   ((vectorp value) (vconcat (mapcar #'magent-store-magent--safe-value-1 value)))
   ((hash-table-p value)
    (let ((table (make-hash-table :test #'equal)))
      (maphash (lambda (k v)
                 (puthash (if (stringp k) k (format "%s" k))
                          (magent-store-magent--safe-value-1 v) table))
               value)
      table))
   ((magent-store-magent--plist-p value)
    (cl-loop for (k v) on value by #'cddr
             nconc (list k (magent-store-magent--safe-value-1 v))))
   ((magent-store-magent--alist-p value)
    (mapcar (lambda (entry)
              (cons (magent-store-magent--key (car entry))
                    (magent-store-magent--safe-value-1 (cdr entry))))
            value))
   ((and (consp value) (proper-list-p value))
    (vconcat (mapcar #'magent-store-magent--safe-value-1 value)))
   (t (format "%S" value))))

(defun magent-store-magent--unencodable-note (what stored-as)
  "Count a value of kind WHAT that JSON cannot hold, stored as STORED-AS."
  (let ((row (assoc what magent-store-magent--unencodable)))
    (if row
        (setcar (cdr row) (1+ (cadr row)))
      (push (list what 1 stored-as) magent-store-magent--unencodable)
      (message "magent-store: %s cannot be written as JSON; it is stored \
as %s (see M-x magent-store-status)" what stored-as))))

(defun magent-store-magent--bad-char-p (char)
  "Return non-nil when CHAR cannot be JSON text.
That is a raw byte or a character beyond Unicode, and a lone surrogate."
  (or (> char #x10FFFF) (<= #xD800 char #xDFFF)))

(defconst magent-store-magent--reader-refuses-nul
  (condition-case nil (ignore (json-parse-string "\"\\u0000\"")) (error t))
  "Non-nil when this Emacs cannot read JSON holding a NUL (Emacs 28).")

(defconst magent-store-magent--reader-refuses-bignum
  (condition-case nil (ignore (json-parse-string "[18446744073709551616]"))
    (error t))
  "Non-nil when this Emacs cannot read an integer beyond 64 bits (Emacs 28).")

(defconst magent-store-magent--int64-max (1- (expt 2 63))
  "The largest integer every Emacs reads back from JSON.")

(defun magent-store-magent--repair (value)
  "Return safe VALUE with everything JSON cannot hold replaced, and noted.
A string keeps every character, each one JSON cannot hold (a raw byte,
a character beyond Unicode, a lone surrogate) becoming U+FFFD, and so
does NUL where this Emacs cannot read it back; a unibyte string is
read as UTF-8 first; a NaN or an infinity becomes its printed form, a
string, and so does an integer beyond 64 bits where this Emacs cannot
read it back."
  (cond
   ((stringp value)
    (let ((text (if (and (not (multibyte-string-p value))
                         (string-match-p "[^[:ascii:]]" value))
                    (decode-coding-string value 'utf-8)
                  value)))
      (when (and magent-store-magent--reader-refuses-nul (string-search "\0" text))
        ;; JSON holds it, but this Emacs's reader would refuse the file.
        (magent-store-magent--unencodable-note "a NUL character" "U+FFFD")
        (setq text (string-replace "\0" "\ufffd" text)))
      (if (cl-some #'magent-store-magent--bad-char-p text)
          (progn
            (magent-store-magent--unencodable-note
             "a string with raw bytes" "text with U+FFFD in their place")
            (apply #'string
                   (mapcar (lambda (c)
                             (if (magent-store-magent--bad-char-p c) #xFFFD c))
                           text)))
        text)))
   ((floatp value)
    (if (or (isnan value) (= value 1.0e+INF) (= value -1.0e+INF))
        (progn (magent-store-magent--unencodable-note
                "a NaN or infinite number" "its printed form, a string")
               (format "%S" value))
      value))
   ((integerp value)
    (if (or (not magent-store-magent--reader-refuses-bignum)
            (<= (- -1 magent-store-magent--int64-max) value magent-store-magent--int64-max))
        value
      (magent-store-magent--unencodable-note "an integer beyond 64 bits"
                                      "its digits, a string")
      (number-to-string value)))
   ((vectorp value) (vconcat (mapcar #'magent-store-magent--repair value)))
   ((hash-table-p value)
    (let ((table (make-hash-table :test #'equal)))
      (maphash (lambda (k v)
                 (puthash (magent-store-magent--repair k) (magent-store-magent--repair v)
                          table))
               value)
      table))
   ((magent-store-magent--plist-p value)
    (cl-loop for (k v) on value by #'cddr
             nconc (list (magent-store-magent--repair-key k)
                         (magent-store-magent--repair v))))
   ((consp value)
    (if (proper-list-p value)
        (mapcar (lambda (entry)
                  (if (and (consp entry) (symbolp (car entry)))
                      (cons (magent-store-magent--repair-key (car entry))
                            (magent-store-magent--repair (cdr entry)))
                    (magent-store-magent--repair entry)))
                value)
      (magent-store-magent--unencodable-note "a dotted list" "its printed form")
      (format "%S" value)))
   (t value)))

(defun magent-store-magent--repair-key (key)
  "Return KEY, a symbol, with a name JSON can hold."
  (let ((name (symbol-name key)))
    (if (cl-some #'magent-store-magent--bad-char-p name)
        (intern (magent-store-magent--repair name))
      key)))

(defun magent-store-magent--encode (value)
  "Return VALUE as JSON text, exactly as magent's writer would encode it.
A value JSON cannot hold does not fail: it is stored in the most
faithful form JSON allows and noted for `magent-store-status'."
  (let* ((safe (magent-store-magent--safe-value value))
         (text (condition-case nil
                   (magent-store-json-serialize safe)
                 (error nil))))
    ;; A NUL is JSON, but Emacs 28 cannot read it back.
    (if (and text (not (and magent-store-magent--reader-refuses-nul
                            (string-search "\\u0000" text))))
        text
      (magent-store-json-serialize (magent-store-magent--repair safe)))))

;;;;; Where a magent session lives

(defun magent-store-magent--action-scope-p (scope)
  "Return non-nil when SCOPE is magent's action scope plist."
  (and (consp scope) (plist-member scope :kind)
       (member (plist-get scope :kind) '(action "action"))
       t))

(defun magent-store-magent--action-name (name)
  "Return the action NAME as magent names it on disk, before cleaning."
  (cond ((stringp name) name)
        ((symbolp name) (symbol-name name))
        (t (format "%s" name))))

(defun magent-store-magent--store-scope (scope)
  "Return magent's SCOPE as the shim core takes it."
  (cond ((magent-store-magent--action-scope-p scope)
         (cons 'action (magent-store-magent--action-name (plist-get scope :action))))
        ((or (null scope) (eq scope 'global) (equal scope "global")) 'global)
        ((stringp scope) scope)
        (t (error "Unknown magent scope %S" scope))))

(defun magent-store-magent--known-session (thread)
  "Return the store session of THREAD if this Emacs has opened it."
  (magent-store-get-session (magent-thread-session-id thread)))

(defun magent-store-magent--scope-directory (scope)
  "Return the directory of the store's sessions under SCOPE, as magent names it."
  (magent-store-scope-directory scope))

(defun magent-store-magent--initial-state (thread)
  "Return THREAD's materialized state as JSON text, or nil.
No event carries a thread's creation time, metadata or first status:
the backend starts a session that has no snapshot yet from this.  nil
when the session has one on disk (the backend would not use it, and a
long conversation would cost Emacs its encoding) or magent lacks
`magent-thread-snapshot-to-alist'."
  (when (and (fboundp 'magent-thread-snapshot-to-alist)
             (not (file-exists-p
                   (magent-store-session-file
                    'snapshot (magent-thread-session-id thread)
                    (magent-store-magent--scope-directory
                     (magent-store-magent--store-scope
                      (magent-thread-scope thread)))))))
    (magent-store-magent--encode (magent-thread-snapshot-to-alist thread))))

(defun magent-store-magent--open-thread (thread)
  "Open THREAD's session in the store, with THREAD's state as its start."
  (let ((id (magent-thread-session-id thread)))
    (or (magent-store-get-session id)
        (magent-store-ensure-session
         id (magent-store-magent--store-scope (magent-thread-scope thread))
         (magent-store-magent--initial-state thread)))))

;;;;; Events and chunks

(defvar magent-store-magent--chunk-thread nil
  "The thread a chunk was just queued for, until its next event or save.
magent asks for a deferred save after every streamed chunk; that save
has nothing to add (see `magent-store-magent--around-save-deferred').")

(defun magent-store-magent--around-append-event (orig thread event)
  "Call ORIG (magent's append) on THREAD and EVENT; queue EVENT for the backend.
The first event of a session this Emacs has not opened opens it, with
the thread as it was before EVENT."
  (when (and thread magent-store-persistence-enabled)
    (magent-store-magent--guarded "opening a session"
      (unless (magent-store-magent--known-session thread)
        (magent-store-magent--open-thread thread))))
  (setq magent-store-magent--chunk-thread nil)
  (let ((appended (funcall orig thread event)))
    (when (and thread event magent-store-persistence-enabled)
      (magent-store-magent--guarded "forwarding an event"
        (unless (magent-store-magent--known-session thread)
          (magent-store-magent--open-thread thread))
        (magent-store-append-event
         (magent-thread-session-id thread)
         (magent-store-magent--encode
          (magent-thread-event-to-alist (or appended event))))))
    appended))



(defun magent-store-magent--after-append-item-content (thread item chunk
                                                       &optional output-p)
  "Queue CHUNK, just appended to ITEM of THREAD (to its output if OUTPUT-P).
The chunk's time is the one magent gave the item, to the last digit: a
float magent already made, so no clock is read and nothing allocated.
A session this Emacs has not opened, and the store has no snapshot
of, is opened from the thread as it is now, which already holds CHUNK."
  (when (and thread item (stringp chunk) (> (length chunk) 0)
             magent-store-persistence-enabled)
    (magent-store-magent--guarded "forwarding a chunk"
      (let* ((known (magent-store-magent--known-session thread))
             (session (or known (magent-store-magent--open-thread thread))))
        ;; A session opened just now from the thread as it is already
        ;; holds CHUNK; one opened from its files does not.
        (when (or known (not (magent-store-session-initial-p session)))
          (when (and magent-store-magent--reader-refuses-nul
                     (string-search "\0" chunk))
            (setq chunk (magent-store-magent--repair chunk)))
          (let ((time (and (fboundp 'magent-thread-item-updated-at)
                           (magent-thread-item-updated-at item))))
            (magent-store-append-item-content
             (magent-thread-session-id thread) (magent-thread-item-id item)
             chunk output-p (if (floatp time) time (float-time)))
            (setq magent-store-magent--chunk-thread thread)))))))

;;;;; Headers and saves

(defun magent-store-magent--metadata-string (session key)
  "Return SESSION's metadata KEY as text, as magent's header has it."
  (let ((value (cdr (assq key (magent-session-metadata session)))))
    (cond ((null value) nil)
          ((stringp value) value)
          ((symbolp value) (symbol-name value))
          (t (format "%s" value)))))

(defun magent-store-magent--origin-scope (session scope)
  "Return the project or global scope SESSION saved under SCOPE belongs to."
  (or (cdr (assq 'origin-scope (magent-session-metadata session)))
      (if (magent-store-magent--action-scope-p scope)
          (or (plist-get scope :origin-scope) 'global)
        scope)
      'global))

(defun magent-store-magent--header-data (session scope)
  "Return the header magent writes for SESSION under SCOPE, as an alist.
magent's own builder when it has one, else the same fields built from
the session object, in magent's order."
  (if (fboundp 'magent-session--header-data-for-session)
      (funcall 'magent-session--header-data-for-session session scope)
    (let* ((origin (magent-store-magent--origin-scope session scope))
           (field (lambda (key)
                    (when-let ((value (magent-store-magent--metadata-string
                                       session key)))
                      (list (cons key value)))))
           (summary (and (fboundp 'magent-session-summary-title)
                         (magent-session-summary-title session)))
           (metadata (magent-session-metadata session)))
      `((id . ,(magent-session-get-id session))
        (schema-version . 7)
        ,@(funcall field 'kind)
        ,@(funcall field 'action)
        ,@(funcall field 'status)
        ,@(funcall field 'title)
        ,@(funcall field 'parent-session-id)
        ,@(and metadata `((metadata . ,(magent-store-magent--safe-value metadata))))
        (scope . ,(if (eq origin 'global) "global" "project"))
        ,@(unless (eq origin 'global) `((project-root . ,origin)))
        ,@(and summary `((summary-title . ,summary)))
        (agent-jobs . ,(vconcat (and (fboundp 'magent-agent-job-to-alist)
                                     (mapcar #'magent-agent-job-to-alist
                                             (magent-session-agent-jobs
                                              session)))))
        (approval-overrides
         . ,(vconcat (mapcar (lambda (entry)
                               `((tool . ,(symbol-name (car entry)))
                                 (decision . ,(symbol-name (cdr entry)))))
                             (magent-session-approval-overrides session))))))))

(defvar magent-store-magent--headers-sent (make-hash-table :test #'equal)
  "Session id -> the header text last given to the backend.")

(defun magent-store-magent--has-content-p (session)
  "Return non-nil when magent would write SESSION at all.
magent writes a session once it has a turn or an agent job."
  (or (magent-thread-turns (magent-session-thread-ledger session))
      (magent-session-agent-jobs session)))

(defun magent-store-magent--put-header (session scope)
  "Give the backend SESSION's header under SCOPE if it changed.
A session saved under another scope than its last moves there first:
magent files it where it is saved.  Return the store session."
  (let* ((thread (magent-session-thread-ledger session))
         (store-session (magent-store-magent--open-thread thread))
         (id (magent-thread-session-id thread)))
    (when (magent-store-magent--has-content-p session)
      (magent-store-move id (magent-store-magent--store-scope scope))
      (let ((text (magent-store-magent--encode
                   (magent-store-magent--header-data session scope))))
        (unless (equal text (gethash id magent-store-magent--headers-sent))
          (magent-store-put-header id text)
          (puthash id text magent-store-magent--headers-sent))))
    store-session))

(defvar magent-store-magent--deferred-headers nil
  "(SESSION . SCOPE) pairs whose header is refreshed at the next header tick.")

(defvar magent-store-magent--header-timer nil
  "Timer of the next header refresh, or nil.")

(defun magent-store-magent--refresh-deferred-headers ()
  "Refresh the headers of the sessions magent asked to save later."
  (let ((pending (nreverse magent-store-magent--deferred-headers)))
    (setq magent-store-magent--deferred-headers nil
          magent-store-magent--header-timer nil)
    (pcase-dolist (`(,session . ,scope) pending)
      (magent-store-magent--guarded "refreshing a header"
        (magent-store-magent--put-header session scope))
      (magent-store-magent--guarded "a deferred save"
        (magent-store-request-flush
         (magent-thread-session-id (magent-session-thread-ledger session)))))))

(defun magent-store-magent--save-scope (session scope)
  "Return SCOPE, or the scope of SESSION's thread when SCOPE is nil."
  (or scope (magent-thread-scope (magent-session-thread-ledger session))))

(defun magent-store-magent--around-save-deferred (_orig session &optional scope _delay)
  "Replace magent's deferred save of SESSION under SCOPE.
The events are flushed within `magent-store-flush-interval'; the header,
whose fields change rarely but cost a little to build, is refreshed
once per interval however often magent asks, except after a chunk."
  (magent-store-magent--guarded "a deferred save"
    (if (eq (magent-session-thread-ledger session) magent-store-magent--chunk-thread)
        ;; The save magent asks for after each streamed chunk: the chunk
        ;; is queued and its flush scheduled, and no header field changes
        ;; with a chunk (the title comes from the first message, recorded
        ;; before the reply streams; the next event's save refreshes the
        ;; header anyway).  Building the header per interval, and its
        ;; pending timer, would cost a streaming Emacs more than the chunk.
        (setq magent-store-magent--chunk-thread nil)
      (magent-store-magent--deferred-save session scope)))
  nil)

(defun magent-store-magent--unwritten-p (session)
  "Return non-nil when magent would not write SESSION and the store has none.
magent writes a session once it has a turn or an agent job: an empty
one must not appear in its listing."
  (not (or (magent-store-magent--known-session (magent-session-thread-ledger session))
           (magent-store-magent--has-content-p session))))

(defun magent-store-magent--deferred-save (session scope)
  "Queue a refresh of SESSION's header under SCOPE and request a flush."
  (let ((thread (magent-session-thread-ledger session))
        (pair (cons session (magent-store-magent--save-scope session scope))))
    (unless (magent-store-magent--unwritten-p session)
      (magent-store-magent--open-thread thread)
      (unless (cl-find-if (lambda (entry) (and (eq (car entry) session)
                                               (equal (cdr entry) (cdr pair))))
                          magent-store-magent--deferred-headers)
        (push pair magent-store-magent--deferred-headers))
      (unless magent-store-magent--header-timer
        (setq magent-store-magent--header-timer
              (run-at-time magent-store-flush-interval nil
                           #'magent-store-magent--refresh-deferred-headers)))
      (magent-store-request-flush (magent-thread-session-id thread)))))

(defun magent-store-magent--around-save (_orig session scope)
  "Replace magent's save of SESSION under SCOPE: header, then a durable flush."
  (unless (magent-store-magent--guarded "a save" (magent-store-magent--unwritten-p session))
    (magent-store-magent--guarded "a save's header"
      (magent-store-magent--put-header session scope))
    (magent-store-magent--guarded "a save"
      (let ((thread (magent-session-thread-ledger session)))
        (magent-store-magent--open-thread thread)
        (magent-store-flush (magent-thread-session-id thread)))))
  nil)

(declare-function magent-session-id "ext:magent-session" (session))
(defvar magent-session--current-scope)

(defun magent-store-magent--forget (id)
  "Forget session ID in Emacs: its queue, its timer, its header."
  (magent-store-forget id)
  (remhash id magent-store-magent--headers-sent))

(defun magent-store-magent--around-clear (orig session &optional scope)
  "Remove SESSION's files under SCOPE from the store, then let ORIG clear it.
magent deletes its own file of the session; the store's log and
snapshot go too, or the next turn of that id would be added to the
cleared conversation."
  (magent-store-magent--guarded "clearing a session"
    (when-let ((id (and session (magent-session-id session))))
      (let* ((open (magent-store-get-session id))
             (target (or scope (bound-and-true-p magent-session--current-scope)))
             (store-scope (if open
                              (magent-store-session-scope open)
                            (magent-store-magent--store-scope target))))
        (setq magent-store-magent--deferred-headers
              (cl-remove session magent-store-magent--deferred-headers :key #'car))
        (magent-store-magent--forget id)
        (magent-store-ensure-backend)
        ;; A session that went on as a fork clears the fork: the session
        ;; it came from holds another machine's turns.
        (magent-store-call "delete"
                            (list (magent-store-json-text (magent-store-session-root))
                                  (magent-store-scope-json store-scope)
                                  (if open (magent-store-session-wire-id open) id))))))
  (funcall orig session scope))

;;;; Opening a session found by a search

(declare-function magent-runtime-load-session-file "ext:magent-runtime-api"
                  (file))
(declare-function magent-runtime-session-from-id "ext:magent-runtime-api"
                  (session-id &optional scope))
(declare-function magent-runtime-session-magent-session "ext:magent-runtime-api"
                  (session))
(declare-function magent-agent-shell--buffers "ext:magent-agent-shell" ())
(declare-function magent-store-search-view "magent-store-search" (hit))
(declare-function magent-store-search-header-line "magent-store-search" (text))
(defvar magent-session--scoped-sessions)

(defun magent-store-magent--live-session (id)
  "Return magent's session object of ID if this Emacs has it, else nil.
A session magent holds may be streaming: loading a second copy of it
would have magent's loader settle that copy as after a restart, writing
a cancelled item and an interrupted turn into the live one."
  (or (when-let* (((fboundp 'magent-runtime-session-from-id))
                  (runtime (magent-runtime-session-from-id id)))
        (magent-runtime-session-magent-session runtime))
      (when (boundp 'magent-session--scoped-sessions)
        (catch 'found
          (maphash (lambda (_scope session)
                     (when (equal (magent-session-get-id session) id)
                       (throw 'found session)))
                   magent-session--scoped-sessions)
          nil))))

(defun magent-store-magent--buffer (id)
  "Return the live buffer of magent's own for session ID, or nil."
  (when (fboundp 'magent-agent-shell--buffers)
    (cl-find-if (lambda (buffer)
                  (equal (ignore-errors
                           (map-nested-elt (buffer-local-value
                                            'agent-shell--state buffer)
                                           '(:session :id)))
                         id))
                (ignore-errors (magent-agent-shell--buffers)))))

(declare-function magent-agent-shell--magent-buffer-p "ext:magent-agent-shell"
                  (buffer))

(defun magent-store-magent-session-id (&optional buffer)
  "Return the id of the session in magent's BUFFER, or nil.
BUFFER defaults to the current buffer; nil when it is none of magent's."
  (let ((buffer (or buffer (current-buffer))))
    (and (fboundp 'magent-agent-shell--magent-buffer-p)
         (ignore-errors (magent-agent-shell--magent-buffer-p buffer))
         (ignore-errors
           (map-nested-elt (buffer-local-value 'agent-shell--state buffer)
                           '(:session :id))))))

(defun magent-store-magent--show (hit where)
  "Show HIT's session: magent's buffer for it, else its transcript.
WHERE says where the session lives, in the transcript's header line.
Return the buffer shown."
  (let ((id (alist-get 'id hit)))
    (if-let ((buffer (magent-store-magent--buffer id)))
        (progn (pop-to-buffer buffer) buffer)
      (let ((buffer (magent-store-search-view hit)))
        (with-current-buffer buffer
          (setq header-line-format
                `(:eval (magent-store-search-header-line
                         ,(format "Saved transcript; the session is %s"
                                  where)))))
        buffer))))

(defun magent-store-magent--resume (header hit)
  "Show HIT's session (header file HEADER) in magent, loading it if need be.
A session this Emacs already holds is shown where it lives, never
loaded again; one magent loads is displayed.  Return the session
magent loaded, or the buffer showing a session it holds, or nil when
the loaded magent has no loader (its runtime is not loaded) or could
not read the session: the search then shows a read-only transcript.
On `magent-store-search-resume-functions' while `magent-store-mode' is
on: magent's release reads the store's sessions only through the mode."
  (let ((id (alist-get 'id hit)))
    (cond
     ((magent-store-magent--live-session id)
      (message "Session %s is already open in magent; showing it, not loading \
it again" id)
      (magent-store-magent--show hit "open in magent"))
     ((fboundp 'magent-runtime-load-session-file)
      (condition-case err
          (if-let* ((loaded (magent-runtime-load-session-file header)))
              (progn
                (magent-store-magent--show
                 hit "loaded in magent, as the current session of its scope")
                (message "Session %s is loaded in magent" id)
                loaded)
            (message "Magent could not read session %s; showing its transcript"
                     id)
            nil)
        (error (user-error "Magent could not load session %s: %s"
                           id (error-message-string err))))))))

;;;; The mode

(defun magent-store-magent--session-directory ()
  "Return magent's session directory; nil until magent has one.
Looked up each time, so that the order magent and the store load in
does not matter; `magent-store-root' overrides it."
  (and (boundp 'magent-session-directory)
       (symbol-value 'magent-session-directory)))

(setq magent-store-default-root-function
      #'magent-store-magent--session-directory)

(declare-function magent-store-timing-mode-sync "magent-store-timing" ())

(defun magent-store-magent--timing-sync ()
  "Let magent-store-timing, when installed, follow `magent-store-mode'."
  (when (require 'magent-store-timing nil t)
    (magent-store-timing-mode-sync)))

(defun magent-store-magent--loaded (_file)
  "Install the advice once magent's session module is loaded.
On `after-load-functions' while the mode waits for magent."
  (when (featurep 'magent-session)
    (remove-hook 'after-load-functions #'magent-store-magent--loaded)
    (when magent-store-mode
      (magent-store-magent--install))))

(defcustom magent-store-find-prepare-delay 10
  "Idle seconds after the mode turns on before the finder's list is made.
`magent-store-mode' then lists the sessions in the background once, so
that the first `magent-store-find-session' shows every session at once
rather than listing them first (about a second for 10,000).  nil: never."
  :type '(choice (number :tag "Seconds idle") (const :tag "Never" nil))
  :group 'magent-store)

(defvar magent-store-magent--prepare-timer nil
  "The idle timer that will have the finder's list made, or nil.
One at most: every pending timer costs Emacs a little at each wakeup.")

(defun magent-store-magent--prepare-finder ()
  "Have the session finder's list made in the background."
  (setq magent-store-magent--prepare-timer nil)
  (when magent-store-mode
    (magent-store-magent--guarded "preparing the session finder"
      (require 'magent-store-find)
      (magent-store-find-prepare))))

(defvar magent-store-magent--start-timer nil
  "The idle timer that will start the backend after the mode turned on, or nil.")

(defun magent-store-magent--start-backend ()
  "Start the backend without waiting for it, if the mode is on and none is up.
Its port, the handshake and the version check then come through its
process filters: the first save finds it ready, or waits only for the
rest of its start.  A backend that cannot start is said once."
  (setq magent-store-magent--start-timer nil)
  (when magent-store-mode
    (condition-case err
        (magent-store-ensure-backend)
      (error (magent-store-give-up (error-message-string err))))))

;;;###autoload
(define-minor-mode magent-store-mode
  "Route magent's session persistence through the magent-store backend.
Events and streamed chunks are forwarded as magent appends them, saves
become header refreshes and flushes, a session is flushed before magent
reads it, and Emacs flushes everything before it exits.  The backend
starts at the first idle moment after the mode turns on.  Only the
functions the loaded magent has are advised; `magent-store-status'
says what the mode makes of the loaded magent (see
`magent-store-magent-functions').  RET on a result of
`magent-store-search' resumes its session in magent.  After
`magent-store-export-for-magent', toggling the mode on asks first."
  :global t
  :group 'magent-store
  (when (and magent-store-mode magent-store-magent--exported
             (called-interactively-p 'any) (eq arg 'toggle))
    (if (y-or-n-p "The sessions were written back for magent and \
magent-store-mode turned off; turn it on again (its next save takes each \
session over again)? ")
        (setq magent-store-magent--exported nil)
      (setq magent-store-mode nil)))
  (if magent-store-mode
      (progn
        (magent-store-magent--install)
        (add-hook 'magent-store-search-resume-functions
                  #'magent-store-magent--resume)
        (unless (featurep 'magent-session)
          (add-hook 'after-load-functions #'magent-store-magent--loaded))
        (add-hook 'kill-emacs-hook #'magent-store-save-at-exit)
        ;; The backend starts at the first idle moment: never inside the
        ;; init file, and never at magent's first save.
        (unless (or magent-store-current-backend
                    (memq magent-store-magent--start-timer timer-idle-list))
          (setq magent-store-magent--start-timer
                (run-with-idle-timer 0 nil #'magent-store-magent--start-backend)))
        (when (and magent-store-find-prepare-delay
                   (not (memq magent-store-magent--prepare-timer timer-idle-list)))
          (setq magent-store-magent--prepare-timer
                (run-with-idle-timer magent-store-find-prepare-delay nil
                                     #'magent-store-magent--prepare-finder))))
    (remove-hook 'after-load-functions #'magent-store-magent--loaded)
    (when magent-store-magent--start-timer
      (cancel-timer magent-store-magent--start-timer)
      (setq magent-store-magent--start-timer nil))
    (when magent-store-magent--prepare-timer
      (cancel-timer magent-store-magent--prepare-timer)
      (setq magent-store-magent--prepare-timer nil))
    (remove-hook 'magent-store-search-resume-functions
                 #'magent-store-magent--resume)
    (magent-store-magent--uninstall)
    (when magent-store-magent--header-timer
      (cancel-timer magent-store-magent--header-timer))
    (magent-store-magent--refresh-deferred-headers)
    (remove-hook 'kill-emacs-hook #'magent-store-save-at-exit)
    (magent-store-magent--guarded "a flush as the mode turns off"
      (magent-store-magent--flush-pending))
    (magent-store-magent--guarded "looking for sessions magent cannot read"
      (magent-store-magent--offer-export (called-interactively-p 'interactive)))))

(add-hook 'magent-store-mode-hook #'magent-store-magent--timing-sync)

(provide 'magent-store-magent)

;; After the provide: it requires this file.
(require 'magent-store-magent-schema6)

;;; magent-store-magent.el ends here
