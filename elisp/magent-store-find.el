;;; magent-store-find.el --- Pick a past magent session from the minibuffer  -*- lexical-binding: t; -*-

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

;; M-x magent-store-find-session reads a session with `completing-read':
;; every session under the root (all scopes, magent's own format too),
;; newest first, by title, annotated with its project, age and size
;; through both `annotation-function' and `affixation-function' (category
;; `magent-store-session'), so the default completion UI, vertico, ivy
;; and consult show them.  Typing narrows as the completion styles do;
;; when the input holds a word of three letters or more that no title
;; holds, the table asks the full-text index (`magent-store search') for
;; the sessions in which the input was said and offers those.  RET opens
;; the session as a search result does (`magent-store-search-open-function').
;;
;; The list comes from `magent-store ls --brief', one process that reads
;; only the headers changed since its last run, or from the backend when
;; one runs (the same listing, without a Python to start; a backend that
;; listed the root before answers with that listing at once).  Emacs
;; keeps the last list of each root: the next time the finder shows it
;; at once and reads it again in the background.

;;; Change Log:

;; 0.1.0: first release.

;;; Code:

(require 'cl-lib)
(require 'subr-x)
(require 'magent-store)
(require 'magent-store-search)

(defgroup magent-store-find nil
  "Pick a past magent session from the minibuffer."
  :group 'magent-store
  :prefix "magent-store-find-")

(defcustom magent-store-find-search-timeout 1.0
  "Seconds the finder waits for the full-text index before showing no match.
A search still running then fills in its sessions for the next key."
  :type 'number
  :group 'magent-store-find)

(defcustom magent-store-find-search-limit 50
  "Most sessions the full-text part of the finder offers."
  :type 'natnum
  :group 'magent-store-find)

(defvar magent-store-find-history nil
  "Sessions picked with `magent-store-find-session'.")

;;;; The list of sessions

(cl-defstruct (magent-store-find--state (:constructor magent-store-find--make-state))
  "What a finder over one session root knows."
  root             ; the session root, a directory name
  candidates       ; the titles, newest session first
  rows             ; title -> [relative id title scope bytes updated schema]
  titles           ; every title, downcased, one per line, made when first needed
  by-path          ; header path under the root -> title, made when first needed
  searching        ; the search process running, or nil
  (searches (make-hash-table :test #'equal)))  ; input -> titles or `pending'

(defvar magent-store-find--states (make-hash-table :test #'equal)
  "Each root's finder state, its last list.")

(defvar magent-store-find--refreshing (make-hash-table :test #'equal)
  "Each root's listing process running in the background.")

(defun magent-store-find--command (root)
  "Return the command line that lists the sessions under ROOT."
  (magent-store-search--command "ls" root "--brief"))

(defun magent-store-find--parse (text)
  "Return the rows in TEXT, the output of `magent-store ls --brief', or nil."
  (when (string-match "^\\[.*$" text)
    (append (json-parse-string (match-string 0 text)
                               :array-type 'array :null-object nil
                               :false-object nil)
            nil)))

(defun magent-store-find--list (root)
  "Return the rows of the sessions under ROOT, reading them now.
Signal a `user-error' with what the listing said when it fails."
  (let ((command (magent-store-find--command root)))
    (with-temp-buffer
      (let* ((status (let ((coding-system-for-read 'utf-8))
                       (apply #'call-process (car command) nil t nil (cdr command))))
             (text (buffer-string))
             (rows (and (eq status 0) (magent-store-find--parse text))))
        (unless (or rows (and (eq status 0) (string-match-p "^\\[\\]$" text)))
          (user-error "Cannot list the sessions under %s: %s" root
                      (string-trim (if (string-blank-p text)
                                       (format "exit status %s" status)
                                     text))))
        rows))))

(defun magent-store-find--from-backend (root)
  "Return the rows of the sessions under ROOT from the running backend.
It gives the rows as `magent-store ls --brief' does, saved where that
listing saves them, read from there: listed now, or, when it has
listed ROOT before, the last listing's at once (listed again behind).
The value is (ROWS . FRESH), FRESH non-nil when they were listed now;
nil when no backend is up, or it could not list them: a listing of its
own then starts Python, which is most of what a first finder waits."
  (when (magent-store-ready-p magent-store-current-backend)
    (condition-case err
        (let ((answer (magent-store-call "brief" (list root))))
          (cons (magent-store-find--saved root) (and (consp answer) (nth 1 answer))))
      (error (message "magent-store: the backend could not list %s (%s); \
listing them apart" root (error-message-string err))
             nil))))

(defun magent-store-find--saved (root)
  "Return the rows the last `magent-store ls --brief' of ROOT saved, or nil.
They are in the backend's state directory, under the name the listing
gives them (the SHA-1 of the root's true name)."
  (let* ((true (file-truename (directory-file-name root)))
         (file (expand-file-name
                (format "brief-rows-%s.json"
                        (secure-hash 'sha1 (encode-coding-string true 'utf-8)))
                (magent-store-log-directory))))
    (when (file-readable-p file)
      (condition-case nil
          (with-temp-buffer
            (let ((coding-system-for-read 'utf-8))
              (insert-file-contents file))
            (let ((saved (json-parse-buffer :object-type 'alist :array-type 'array
                                            :null-object nil :false-object nil)))
              (and (equal (alist-get 'root saved) true)
                   (append (alist-get 'rows saved) nil))))
        (error nil)))))

(defun magent-store-find--refresh (root state)
  "List ROOT again in the background, to fill STATE with the new list.
With STATE nil, the listing only saves its rows (see
`magent-store-find--saved'): nothing is read into this Emacs."
  (unless (process-live-p (gethash root magent-store-find--refreshing))
    (puthash root
             (magent-store-program-run
              "magent-store-find-ls" (list "ls" root "--brief")
              (lambda (_process text status)
                (unwind-protect
                    (when-let* ((state)
                                ((eq status 0))
                                (rows (magent-store-find--parse text)))
                      (magent-store-find--fill state rows))
                  (remhash root magent-store-find--refreshing))))
             magent-store-find--refreshing)))

(defun magent-store-find--title (row)
  "Return ROW's title on one line, or its id when it has none."
  (let ((title (aref row 2)))
    (cond ((or (not (stringp title)) (equal title "")
               (and (memq (aref title 0) '(?\s ?\t ?\n ?\r)) (string-blank-p title)))
           (aref row 1))
          ;; Most titles need nothing: tested without a regexp, which would
          ;; walk the whole title for a space at its end.
          ((or (string-search "\n" title) (string-search "\r" title)
               (string-search "\t" title)
               (eq (char-syntax (aref title 0)) ?\s)
               (eq (char-syntax (aref title (1- (length title)))) ?\s))
           (string-trim (replace-regexp-in-string "[\n\r\t]+" " " title)))
          (t title))))

(defun magent-store-find--fill (state rows)
  "Make ROWS STATE's sessions, by title.
A title two sessions share is followed by each one's id."
  (let ((table (make-hash-table :test #'equal :size (length rows)))
        (seen (make-hash-table :test #'equal :size (length rows)))
        (titles (mapcar #'magent-store-find--title rows))
        candidates)
    (dolist (title titles)
      (puthash title (1+ (gethash title seen 0)) seen))
    (cl-loop for title in titles
             for row in rows
             for candidate = (if (> (gethash title seen) 1)
                                 (format "%s (%s)" title (aref row 1))
                               title)
             do (puthash candidate row table)
             (push candidate candidates))
    (setf (magent-store-find--state-candidates state) (nreverse candidates)
          (magent-store-find--state-rows state) table
          ;; Both made when first needed: the first list waits for neither.
          (magent-store-find--state-titles state) nil
          (magent-store-find--state-by-path state) nil)
    (clrhash (magent-store-find--state-searches state))
    state))

(defun magent-store-find--state (root)
  "Return the finder's state over ROOT: its last list at once, else read now.
The last list is this Emacs's, else the one the listing saved, else the
running backend's last listing; it is read again in the background.
Read now, it is the running backend's answer when one runs."
  (let ((state (gethash root magent-store-find--states))
        (listed nil)
        ;; Some megabytes of short-lived strings for 10,000 sessions:
        ;; collected once, after, rather than a dozen times on the way.
        (gc-cons-threshold (max gc-cons-threshold (* 64 1024 1024))))
    (if state
        ;; What was said may have changed since: ask the index again.
        (clrhash (magent-store-find--state-searches state))
      (setq state (magent-store-find--make-state :root root))
      (magent-store-find--fill
       state (or (magent-store-find--saved root)
                 (let ((served (magent-store-find--from-backend root)))
                   (setq listed (cdr served))
                   (car served))
                 (progn (setq listed t)
                        (magent-store-find--list root))))
      (puthash root state magent-store-find--states))
    (unless listed
      (magent-store-find--refresh root state))
    state))

(defun magent-store-find-prepare (&optional root)
  "List the sessions under ROOT in the background, for the finder's first use.
The listing saves its rows, which the finder then shows at once, in
this Emacs or another; nothing is read into this Emacs now.  Nothing
happens when ROOT is not a directory or this Emacs already holds its
list.  `magent-store-mode' calls this once, when Emacs is first idle
after it turns on (see `magent-store-find-prepare-delay')."
  (let ((root (file-name-as-directory (expand-file-name (or root (magent-store-session-root))))))
    (when (and (file-directory-p root)
               (not (gethash root magent-store-find--states)))
      (magent-store-find--refresh root nil))))

;;;; The full-text part

(defun magent-store-find--unmatched-p (state input)
  "Return non-nil when INPUT has a word of 3 letters or more not in a title.
The titles are STATE's."
  (let ((titles (or (magent-store-find--state-titles state)
                    (setf (magent-store-find--state-titles state)
                          (downcase (mapconcat #'identity
                                               (magent-store-find--state-candidates state)
                                               "\n"))))))
    (cl-some (lambda (word)
               (and (>= (length word) 3)
                    (not (string-search (downcase word) titles))))
             (split-string input "[ \t\"]+" t))))

(defun magent-store-find--hit-candidate (state hit)
  "Return the candidate of search HIT's session, adding it to STATE if new."
  (let* ((root (magent-store-find--state-root state))
         (relative (string-remove-prefix (file-name-as-directory root)
                                         (or (alist-get 'header hit) "")))
         (rows (magent-store-find--state-rows state))
         (by-path (or (magent-store-find--state-by-path state)
                      (let ((table (make-hash-table :test #'equal :size (hash-table-count rows))))
                        (maphash (lambda (candidate row) (puthash (aref row 0) candidate table))
                                 rows)
                        (setf (magent-store-find--state-by-path state) table)))))
    (or (gethash relative by-path)
        (let ((candidate (format "%s (%s)" (or (alist-get 'title hit) (alist-get 'id hit))
                                 (alist-get 'id hit))))
          (puthash relative candidate by-path)
          (puthash candidate
                   (vector relative (alist-get 'id hit) (alist-get 'title hit)
                           (alist-get 'scope-label hit) nil (alist-get 'time hit)
                           (alist-get 'schema hit))
                   rows)
          candidate))))

(defun magent-store-find--searched (state input text status)
  "Keep what the search for INPUT found (TEXT, exit STATUS) in STATE."
  (let ((reply (and (memq status '(0 1)) (magent-store-search--parse text))))
    (puthash input
             (mapcar (lambda (hit) (magent-store-find--hit-candidate state hit))
                     (alist-get 'hits reply))
             (magent-store-find--state-searches state))))

(defun magent-store-find--search (state input)
  "Return the candidates of STATE's sessions in which INPUT was said.
Asks the full-text index once per INPUT, waiting at most
`magent-store-find-search-timeout' seconds (less when a key is
pressed); a search not done by then gives nil now and its sessions
at the next call.  One search runs at a time (the first one may build
the index): another input waits for the next call after it is done."
  (let* ((searches (magent-store-find--state-searches state))
         (known (gethash input searches 'unknown)))
    (cond
     ((not (eq known 'unknown)) (and (listp known) known))
     ((process-live-p (magent-store-find--state-searching state)) nil)
     (t
      (puthash input 'pending searches)
      (let* ((output (generate-new-buffer " *magent-store-find-search*"))
             (process
              (make-process
               :name "magent-store-find-search" :buffer output
               :command (magent-store-search--command
                         "search" input (magent-store-find--state-root state) "--json"
                         "--limit" (number-to-string magent-store-find-search-limit))
               :coding 'utf-8 :connection-type 'pipe :noquery t
               :sentinel
               (lambda (process _event)
                 (unless (process-live-p process)
                   (unwind-protect
                       (magent-store-find--searched
                        state input (with-current-buffer output (buffer-string))
                        (process-exit-status process))
                     (kill-buffer output))))))
             (deadline (+ (float-time) magent-store-find-search-timeout)))
        (setf (magent-store-find--state-searching state) process)
        (while (and (process-live-p process)
                    (< (float-time) deadline)
                    (or noninteractive (not (input-pending-p))))
          (accept-process-output process 0.02))
        ;; The sentinel runs after the process is gone; let it.
        (while (and (not (process-live-p process))
                    (eq (gethash input searches) 'pending)
                    (< (float-time) deadline))
          (accept-process-output nil 0.01))
        (let ((found (gethash input searches)))
          (and (listp found) found)))))))

(defun magent-store-find--found (state input)
  "Return the search's candidates for INPUT when STATE's titles cannot match it.
Nil when every word of 3 letters or more is in some title."
  (and (magent-store-find--unmatched-p state input)
       (magent-store-find--search state (string-trim input))))

;;;; Annotations

(defun magent-store-find--age (time)
  "Return how long ago TIME (seconds since the epoch) was, shortly."
  (if (not (numberp time))
      "-"
    (let ((s (max 0 (- (float-time) time))))
      (cond ((< s 60) "now")
            ((< s 3600) (format "%dm" (/ s 60)))
            ((< s 86400) (format "%dh" (/ s 3600)))
            ((< s (* 86400 60)) (format "%dd" (/ s 86400)))
            ((< s (* 86400 730)) (format "%dmo" (/ s (* 86400 30))))
            (t (format "%dy" (/ s (* 86400 365))))))))

(defun magent-store-find--project (scope)
  "Return the scope label SCOPE as a place: a project's root, global, an action."
  (cond ((null scope) "")
        ((string-prefix-p "project:" scope)
         (abbreviate-file-name (substring scope (length "project:"))))
        ((string-prefix-p "action:" scope)
         (concat "action " (substring scope (length "action:"))))
        (t scope)))

(defun magent-store-find--describe (row)
  "Return ROW's project, age, size and format, in columns."
  (format "%-32s %5s %9s%s"
          (let ((place (magent-store-find--project (aref row 3))))
            ;; A long root keeps its end: the project's own name.
            (if (> (length place) 32)
                (concat "…" (substring place (- (length place) 31)))
              place))
          (magent-store-find--age (aref row 5))
          (if (numberp (aref row 4)) (file-size-human-readable (aref row 4) 'iec " ") "")
          (if (eql (aref row 6) 6) "  schema 6" "")))

(defconst magent-store-find--title-width-max 60
  "The widest title the annotations are aligned past; longer ones push theirs.")

(defun magent-store-find--title-width (candidates)
  "Return the column CANDIDATES' annotations start at, from each one's start."
  (+ 2 (min magent-store-find--title-width-max
            (apply #'max 0 (mapcar #'string-width candidates)))))

(defun magent-store-find--annotation (candidate row width)
  "Return ROW's annotation of CANDIDATE, starting WIDTH columns past its start.
The padding is spaces, counted from the candidate's own start: the
default completion UI lays candidates out in columns, and a space
aligned to a column of the window (`:align-to') put the annotations of
the second column right after their titles."
  (concat (make-string (max 2 (- width (string-width candidate))) ?\s)
          (propertize (magent-store-find--describe row)
                      'face 'completions-annotations)))

(defun magent-store-find--annotator (state)
  "Return the `annotation-function' of STATE's sessions.
Their annotations start in one column, past the longest title of all."
  (let (widest-of width)
    (lambda (candidate)
      (when-let* ((row (gethash candidate (magent-store-find--state-rows state))))
        (let ((candidates (magent-store-find--state-candidates state)))
          (unless (eq candidates widest-of)
            (setq widest-of candidates
                  width (magent-store-find--title-width candidates))))
        (magent-store-find--annotation candidate row width)))))

(defun magent-store-find--affixer (state)
  "Return the `affixation-function' of STATE's sessions.
Their annotations start in one column, past the longest title shown."
  (lambda (candidates)
    (let ((width (magent-store-find--title-width candidates))
          (rows (magent-store-find--state-rows state)))
      (mapcar (lambda (candidate)
                (let ((row (gethash candidate rows)))
                  (list candidate ""
                        (if row
                            (magent-store-find--annotation candidate row width)
                          ""))))
              candidates))))

;;;; The completion table

(defun magent-store-find--table (state)
  "Return the completion table of STATE's sessions.
An input that no title can match asks the full-text index."
  (let ((metadata `(metadata (category . magent-store-session)
                             (annotation-function . ,(magent-store-find--annotator state))
                             (affixation-function . ,(magent-store-find--affixer state))
                             (display-sort-function . identity)
                             (cycle-sort-function . identity))))
    (lambda (string pred action)
      (cond
       ((eq action 'metadata) metadata)
       ((eq (car-safe action) 'boundaries) nil)
       ((eq action 'magent-store-find-found)
        (magent-store-find--found state string))
       ;; Every session is a match, one the index found since the list too.
       ((and (eq action 'lambda)
             (gethash string (magent-store-find--state-rows state)))
        t)
       (t
        (if-let* ((found (magent-store-find--found state string)))
            (let ((found (if pred (cl-remove-if-not pred found) found)))
              (pcase action
                ('t found)
                ('lambda (and (member string found) t))
                (_ (cond ((member string found) t)
                         ((null (cdr found)) (car found))
                         (t string)))))
          (complete-with-action action (magent-store-find--state-candidates state)
                                string pred)))))))

;; A completion style that gives the index's sessions as they are: the
;; user's styles would drop them, their titles lacking the typed words.
(defun magent-store-find--style-found (string table pred)
  "Return what TABLE's index found for STRING (PRED filters it), or nil."
  (and (functionp table)
       (condition-case nil
           (let ((found (funcall table string nil 'magent-store-find-found)))
             (if pred (cl-remove-if-not pred found) found))
         (error nil))))

(defvar magent-store-find--user-overrides nil
  "`completion-category-overrides' as the user set it.")

(defun magent-store-find--other-styles (function string table pred point)
  "Call FUNCTION (a `completion-*-completions') as the user's styles would.
STRING, TABLE, PRED and POINT are the style's arguments."
  (let ((completion-category-overrides magent-store-find--user-overrides))
    (funcall function string table pred point)))

(defun magent-store-find-style-try (string table pred point)
  "The `magent-store-find' style's `try-completion' of STRING at POINT.
TABLE and PRED are the completion's."
  (if-let* ((found (magent-store-find--style-found string table pred)))
      (if (and (null (cdr found)) (not (equal (car found) string)))
          (cons (car found) (length (car found)))
        (or (and (member string found) t) (cons string point)))
    (magent-store-find--other-styles #'completion-try-completion string table pred point)))

(defun magent-store-find-style-all (string table pred point)
  "The `magent-store-find' style's `all-completions' of STRING at POINT.
TABLE and PRED are the completion's."
  (if-let* ((found (magent-store-find--style-found string table pred)))
      (nconc (copy-sequence found) 0)
    (magent-store-find--other-styles #'completion-all-completions string table pred point)))

(add-to-list 'completion-styles-alist
             '(magent-store-find magent-store-find-style-try magent-store-find-style-all
                                 "The sessions the full-text index found, else the usual styles."))

;;;; Reading and opening a session

(defun magent-store-find--hit (state candidate)
  "Return CANDIDATE of STATE as a search hit (what the search list opens)."
  (let ((row (gethash candidate (magent-store-find--state-rows state)))
        (root (magent-store-find--state-root state)))
    (unless row
      (user-error "No session %S" candidate))
    `((id . ,(aref row 1))
      (title . ,(aref row 2))
      (scope-label . ,(aref row 3))
      (header . ,(expand-file-name (aref row 0) root))
      (root . ,root)
      (time . ,(aref row 5))
      (schema . ,(aref row 6)))))

(defun magent-store-find-table (&optional root)
  "Return a completion table over every session under ROOT.
ROOT defaults to the session root magent-store uses.  Its candidates
are the sessions' titles, newest first; its metadata annotates them."
  (let ((root (file-name-as-directory (expand-file-name (or root (magent-store-session-root))))))
    (unless (file-directory-p root)
      (user-error "No session root at %s" root))
    (let ((state (magent-store-find--state root)))
      (cons state (magent-store-find--table state)))))

(defun magent-store-find-read-session (prompt &optional root)
  "Read a session under ROOT with PROMPT; return it as a search hit.
The hit is an alist: id, title, scope-label, header (its header file),
root, time and schema."
  (pcase-let* ((`(,state . ,table) (magent-store-find-table root))
               (magent-store-find--user-overrides completion-category-overrides)
               (completion-category-overrides
                (if (assq 'magent-store-session completion-category-overrides)
                    completion-category-overrides
                  (cons '(magent-store-session (styles magent-store-find))
                        completion-category-overrides)))
               (candidate (completing-read prompt table nil t nil
                                           'magent-store-find-history)))
    (when (string-empty-p candidate)
      (user-error "No session chosen"))
    (magent-store-find--hit state candidate)))

;;;###autoload
(defun magent-store-find-session (&optional root)
  "Pick a session under ROOT from the minibuffer and open it.
Every session is a candidate, by title, newest first, with its
project, age and size; words that no title holds are looked up in
what was said (the full-text index).  The session opens as a search
result does: in magent when `magent-store-mode' is on, else as a
read-only transcript (`magent-store-search-open-function')."
  (interactive)
  (funcall magent-store-search-open-function
           (magent-store-find-read-session "Session: " root)))

(provide 'magent-store-find)
;;; magent-store-find.el ends here
